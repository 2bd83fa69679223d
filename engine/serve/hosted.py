"""``folio serve``'s models: the library (the catalog and ``--models-dir``), a ModelHost
over it within the memory budget, ``--model`` loaded at start, and the reaper that
unloads idle models. Every setting is checked when built, before anything loads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from engine.config import EngineConfig
from engine.hosting import ModelHost, parse_keep_alive
from engine.hosting.budget import GIB, default_budget_bytes
from engine.hosting.library import ModelLibrary
from engine.hosting.reaper import Reaper
from engine.serve.models import HostedModels


class HostedServe:
    def __init__(self, model: str, models_dirs: list[str], keep_alive: str,
                 memory_gib: float | None, config: EngineConfig) -> None:
        """ValueError names a bad setting (`--keep-alive`, `--memory-gib`, `models_dirs`);
        UnknownModel says `model` is neither listed nor a path."""
        keep_alive_s = parse_keep_alive(keep_alive, "--keep-alive")
        if memory_gib is not None and not memory_gib > 0:
            raise ValueError(f"--memory-gib must be > 0, got {memory_gib}")
        # A --model path outside the library joins it.
        extra = [model] if Path(model).expanduser().exists() else []
        self.library = ModelLibrary(extra, models_dirs)
        self.name = self.library.name_of(model)
        budget = int(memory_gib * GIB) if memory_gib is not None else \
            default_budget_bytes(config)
        self.budget_gib = budget / GIB
        # --mmproj goes with --model alone; every other model finds its own beside it.
        shared = dataclasses.replace(config, mmproj=None)
        if config.mmproj is not None:
            _check_mmproj(self.library.info(self.name).path, config.mmproj)
        self.host = ModelHost(shared, budget, keep_alive_s=keep_alive_s,
                              load=self.library.loader(shared, {self.name: config}),
                              estimate=self.library.estimator(shared))
        self._reaper: Reaper | None = None

    def start(self) -> HostedModels:
        """Load the first model (blocking), start the reaper; the models to serve."""
        self.host.lease(self.name).release()
        self._reaper = Reaper(self.host).start()
        return HostedModels(self.host, self.library, self.name)

    def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.stop()
        self.host.shutdown()


def _check_mmproj(model: Path, mmproj: str) -> None:
    """--mmproj found, an mmproj file of a projector type Folio runs, and beside a .gguf
    model; its width and image tokens are checked when the model loads."""
    from engine.loaders.gguf.mmproj import find_mmproj, read_mmproj_header
    from engine.vision.mmproj import projector_of

    found = find_mmproj(model, mmproj, "--mmproj")  # an explicit path: found or refused
    if found is not None:
        projector_of(read_mmproj_header(found))
