"""The models a server answers for, by name: the catalog's listing (the starter, the
Hugging Face cache, extra model folders and .gguf files), plus the .gguf files and model
folders found in the models folders it is given (``folio serve --models-dir``, looked at
again on each listing); and how the ModelHost loads each and estimates its memory.

A name is the catalog's (``starter``, a repo id, a file's stem or a folder's name); the
first model listed under a name keeps it. The name a model's engine reports (the
starter's file stem, which a one-model server answered to) is taken as an alias. Paths
the catalog could not read are left out of the names and kept in ``problems``, so a bad
file is reported, not served.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.loaders.base import display_name
from engine.loaders.catalog import STARTER, ModelInfo, list_local_models
from engine.loaders.gguf.mmproj import is_mmproj_name


class UnknownModel(LookupError):
    """A name the library does not list."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        known = list(known)
        shown = ", ".join(known[:8]) + (f" and {len(known) - 8} more" if len(known) > 8 else "")
        super().__init__(f"model {name!r} is not in this server's library"
                         f"{f' ({shown})' if known else ''}; GET /v1/models lists them")
        self.name = name


def models_in(folder: Path) -> list[Path]:
    """The .gguf files and model folders (with a config.json) directly in `folder`; a
    model's mmproj file (its vision projector, engine/loaders/gguf/mmproj.py) is none."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []  # gone since: its models are no longer listed
    return [p for p in entries if (p.is_file() and p.suffix.lower() == ".gguf"
                                   and not is_mmproj_name(p))
            or (p.is_dir() and (p / "config.json").is_file())]


class ModelLibrary:
    def __init__(self, extra_paths: Iterable[str | Path] = (),
                 models_dirs: Iterable[str | Path] = (), *,
                 list_models: Callable[[list[Path]], list[ModelInfo]] = list_local_models
                 ) -> None:
        self.extra_paths = [Path(p).expanduser() for p in extra_paths]
        self.models_dirs = [Path(p).expanduser() for p in models_dirs]
        for folder in self.models_dirs:
            if not folder.is_dir():
                raise ValueError(f"models_dirs: {folder} is not a folder")
        self._list_models = list_models
        self._models: dict[str, ModelInfo] = {}
        self._aliases: dict[str, str] = {}
        self.problems: list[ModelInfo] = []
        self.refresh()

    def refresh(self) -> None:
        """List again (a model added to a folder since is found)."""
        models: dict[str, ModelInfo] = {}
        problems = []
        found = [path for folder in self.models_dirs for path in models_in(folder)]
        for info in self._list_models(self.extra_paths + found):
            if info.error:
                problems.append(info)
            else:
                models.setdefault(info.name, info)
        aliases = {display_name(info.path): name for name, info in models.items()}
        self._aliases = {alias: name for alias, name in aliases.items() if alias not in models}
        self._models, self.problems = models, problems

    def names(self) -> list[str]:
        return list(self._models)

    def info(self, name: str) -> ModelInfo:
        """The model listed as `name` (or an alias); UnknownModel if none is (after a
        fresh listing, so a file added since the server started is found)."""
        return self._models[self.resolve(name)]

    def resolve(self, name: str) -> str:
        """The library name of `name` or of an alias; UnknownModel if neither is listed
        (after a fresh listing)."""
        for attempt in range(2):
            if name in self._models:
                return name
            if name in self._aliases:
                return self._aliases[name]
            if attempt == 0:
                self.refresh()
        raise UnknownModel(name, self._models)

    def max_model_len(self, name: str, config: EngineConfig) -> int:
        """The context the engine gives `name` under `config` (its max_model_len rule)."""
        context = self.info(name).context_length
        return max(1, min(config.max_model_len or context, context))

    def name_of(self, model: str) -> str:
        """`model` as a library name: a name or alias, or a path as the name it is listed
        under (the caller adds a path outside the library to extra_paths first)."""
        if model in self._models or model in self._aliases:
            return self.resolve(model)
        path = Path(model).expanduser()
        if path.exists():
            for name, info in self._models.items():
                if info.path.resolve() == path.resolve():
                    return name
        raise UnknownModel(model, self._models)

    def source(self, name: str) -> str:
        """What LLM() loads for `name`."""
        info = self.info(name)
        return STARTER if name == STARTER else str(info.path)

    def loader(self, config: EngineConfig,
               own: Mapping[str, EngineConfig] | None = None) -> Callable[[str], Any]:
        """The ModelHost's `load`: a started EngineWorker over the model, under `config`
        or, for a name in `own`, its own (the --model's --mmproj)."""

        def load(name: str):
            from engine.llm import LLM
            from engine.worker import EngineWorker

            return EngineWorker(LLM(self.source(name), (own or {}).get(name, config))).start()

        return load

    def estimator(self, config: EngineConfig) -> Callable[[str], int]:
        """The ModelHost's `estimate`: weights and KV pool, from the header."""

        def estimate(name: str) -> int:
            from engine.runner.kv_cache import estimate_memory

            return estimate_memory(self.info(name), config).total_bytes

        return estimate
