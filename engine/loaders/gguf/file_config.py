"""A GGUF model's config read back from its cache entry as plain attributes.

The first load of a file builds a transformers config from the file's keys (its class
fills in the family's defaults and moves rope settings into ``rope_parameters``); the cache
keeps that config whole (``to_dict()``, with the class's ``attribute_map`` of aliases), and
later loads read it back into a ``FileConfig``. The engine's models only read attributes
(engine/models/spec.py), so they see the same values without transformers importing the
family's configuration module, which alone costs about a second of every load.
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


def config_record(config) -> dict[str, object] | None:
    """What a cache entry keeps of a transformers config: its values as its own JSON
    writes them (dtypes as names, sub-configs as dicts) and its aliases; None for a config
    whose layers differ (Gemma 4's ``per_layer_config``: its per-layer views and the guard
    on reading their attributes globally are transformers' own), rebuilt on every load."""
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
