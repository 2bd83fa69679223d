"""A GGUF file's `{arch}.*` metadata keys, each read or rejected by name: a missing or
malformed key is a FolioLoadError that names it and says what to do."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from engine.loaders.base import FolioLoadError


class GGUFKeys:
    """The file's `{arch}.*` keys, each read or rejected by name."""

    def __init__(self, metadata: Mapping[str, object], arch: str, where: Path,
                 tensor_names: set[str] | frozenset[str] = frozenset()) -> None:
        self.metadata, self.arch, self.where = metadata, arch, where
        self.tensor_names = tensor_names

    def optional(self, name: str) -> object:
        return self.metadata.get(f"{self.arch}.{name}")

    def get(self, name: str, default: object = None) -> object:
        value = self.metadata.get(f"{self.arch}.{name}", default)
        if value is None:
            raise FolioLoadError(f"{self.where}: metadata {self.arch}.{name} is missing; the "
                                 "file is incomplete, download or convert it again")
        return value

    def bad(self, name: str, value: object, expected: str) -> FolioLoadError:
        shown = f"{len(value)} flags" if isinstance(value, tuple) else repr(value)
        return FolioLoadError(f"{self.where}: metadata {self.arch}.{name} is {shown}, not "
                              f"{expected}; the file is damaged, download or convert it again")

    def count(self, name: str, default: object = None, minimum: int = 1) -> int:
        """An integer key >= minimum (a GGUF uint32); bools and floats are malformed."""
        value = self.get(name, default)
        if type(value) is not int or value < minimum:
            raise self.bad(name, value, "a positive integer" if minimum == 1 else
                           f"an integer >= {minimum}")
        return value

    def positive(self, name: str, default: object = None) -> float:
        """A finite number > 0 (a GGUF float32), as stored."""
        value = self.get(name, default)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value <= 0):
            raise self.bad(name, value, "a positive number")
        return float(value)


def per_layer(keys: GGUFKeys, name: str, layers: int) -> tuple[int, ...]:
    """A key stored once or once per layer, as one value per layer."""
    value = keys.get(name)
    if not isinstance(value, tuple):
        return (int(value),) * layers
    if len(value) != layers:
        raise keys.bad(name, value, f"one value per layer ({layers})")
    return value


def first(value: object) -> int:
    return int(value[0] if isinstance(value, tuple) else value)


def f32(value: object) -> float:
    # GGUF stores float32; its shortest str gives back the config's value (1e-05, not 9.99e-06).
    return float(str(np.float32(value)))
