"""A GGUF model's config as plain attributes: built from the file's keys, or read back
from its cache entry.

The engine's models only read attributes (engine/models/spec.py), so a ``FileConfig``
serves them without transformers importing the family's configuration module, which pulls
in much of transformers' model code. A family whose registry entry lists its
``config_defaults`` gets one on a first load too (``config_from_values``: a GGUF file's
keys or a folder's config.json, those defaults, the rope settings as transformers 5 keeps
them); any other family's first load builds transformers' config class (its class fills
in the family's defaults, layer patterns and the like). Either way the cache keeps the
config whole (its values and its ``attribute_map`` of aliases), and later loads read it
back into a ``FileConfig``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping


class FileConfig:
    """Attributes from a transformers config's ``to_dict()``; ``attribute_map``'s aliases
    (``num_local_experts`` for ``num_experts``, say) read the attribute they name."""

    def __init__(self, values: Mapping[str, object],
                 attribute_map: Mapping[str, str] | None = None) -> None:
        self.__dict__.update(copy.deepcopy(dict(values)))
        object.__setattr__(self, "_aliases", dict(attribute_map or {}))

    def __getattr__(self, name: str):
        # Only reached for names not set: an alias, or a missing attribute.
        aliases = self.__dict__.get("_aliases", {})
        if name in aliases:
            return getattr(self, aliases[name])
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def to_dict(self) -> dict[str, object]:
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k != "_aliases"})

    def __repr__(self) -> str:
        return f"FileConfig({getattr(self, 'model_type', '?')})"


def config_from_values(values: Mapping[str, object],
                       defaults: Mapping[str, object]) -> FileConfig:
    """A config from a GGUF file's config dict (engine/loaders/gguf/config.py's) or a
    config.json, with its family's ``defaults`` under it, as transformers 5's classes for
    the families that list defaults keep it: rope theta and scaling in one
    ``rope_parameters`` (an older file's scaling ``type`` named ``rope_type`` too), and a
    sliding window that is switched off (``use_sliding_window`` false) as None."""
    merged = {**defaults, **values}
    theta = merged.pop("rope_theta", None)
    scaling = merged.pop("rope_scaling", None)
    params = dict(merged.get("rope_parameters") or scaling or {"rope_type": "default"})
    if "type" in params:
        params.setdefault("rope_type", params["type"])
    if params.get("rope_theta") is None:
        params["rope_theta"] = theta if theta is not None else defaults.get("rope_theta")
    merged["rope_parameters"] = params
    if merged.get("use_sliding_window") is False:
        merged["sliding_window"] = None
    return FileConfig(merged)


def config_record(config) -> dict[str, object] | None:
    """What a cache entry keeps of a config: a FileConfig's values and aliases, or a
    transformers config's values as its own JSON writes them (dtypes as names, sub-configs
    as dicts) and its aliases; None for a config whose layers differ (Gemma 4's
    ``per_layer_config``: its per-layer views and the guard on reading their attributes
    globally are transformers' own), rebuilt on every load."""
    if isinstance(config, FileConfig):
        return {"values": config.to_dict(), "attribute_map": dict(config._aliases)}
    if getattr(config, "is_heterogeneous", False):
        return None
    values = json.loads(config.to_json_string(use_diff=False))
    return {"values": values, "attribute_map": dict(getattr(config, "attribute_map", {}))}


def config_from_record(record: Mapping[str, object]) -> FileConfig:
    """KeyError, TypeError or ValueError when the record is not one config_record wrote."""
    values = dict(record["values"])
    if isinstance(values.get("id2label"), dict):  # JSON made its keys strings, as
        values["id2label"] = {int(k): v for k, v in values["id2label"].items()}  # config.json
    return FileConfig(values, record["attribute_map"])
