"""A GGUF file's header: its key/values and tensor directory, read without the tensor data.

`gguf.GGUFReader` takes seconds on a real model because it builds numpy views for every
vocabulary entry and merge; this walks the same bytes with struct and skips the arrays, so
it takes tens of milliseconds. The models catalog lists files with it and the loader reads
the tensor directory from it.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from engine.loaders.base import FolioLoadError

# GGUF value type ids (the format's spec) -> struct format; 8 is a string, 9 an array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY, _BOOL = 8, 9, 7
_INTEGERS = (0, 1, 2, 3, 4, 5, 10, 11)
_MAX_LAYERS = 1024  # longer integer arrays are not per-layer values
_DEFAULT_ALIGNMENT = 32  # the spec's, when general.alignment is absent
_TRUNCATED = "the header runs past the end of the file: it is truncated"


@dataclass(slots=True)
class GGUFTensorInfo:
    name: str  # the GGUF name, e.g. "blk.0.attn_q.weight"
    shape: tuple[int, ...]  # Hugging Face order: outermost dimension first
    qtype: int  # a gguf.GGMLQuantizationType value, unchecked
    offset: int  # absolute byte offset of the tensor's data in the file


@dataclass(slots=True)
class GGUFHeader:
    # Arrays (vocabulary, merges) are given as their lengths, except arrays of bools
    # (per-layer flags) and short integer arrays outside tokenizer.* (per-layer values),
    # given as tuples.
    metadata: dict[str, object]
    tensors: list[GGUFTensorInfo]


GGUF_MAGIC = b"GGUF"


def check_gguf_magic(path: Path) -> None:
    """ValueError unless the file starts with GGUF's magic bytes."""
    with open(path, "rb") as handle:
        magic = handle.read(4)
    _check_magic_bytes(magic)


def _check_magic_bytes(magic: bytes) -> None:
    if magic != GGUF_MAGIC:
        raise ValueError(f"it starts with {magic!r}, not {GGUF_MAGIC!r}")


def parse_gguf_header(path: Path, arrays: frozenset[str] = frozenset()) -> GGUFHeader:
    """The header of the GGUF at `path`; the arrays of the keys in ``arrays`` are read
    whole, as lists (the tokenizer's vocabulary, say). Raises OSError, or ValueError saying
    what is wrong with the file; callers phrase the user's message."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0,
                                               access=mmap.ACCESS_READ) as buf:
        _check_magic_bytes(bytes(buf[:4]))
        cursor = _Cursor(buf, 4)
        version = cursor.take("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported")
        tensor_count, kv_count = cursor.take("<Q"), cursor.take("<Q")
        metadata: dict[str, object] = {}
        for _ in range(kv_count):
            key = cursor.string()
            if key in metadata:
                raise ValueError(f"the key {key} appears twice")
            kind = cursor.take("<I")
            metadata[key] = (cursor.array() if key in arrays and kind == _ARRAY else
                             cursor.value(kind, per_layer=not key.startswith("tokenizer.")))
        directory = []
        for _ in range(tensor_count):
            name = cursor.string()
            dims = [cursor.take("<Q") for _ in range(cursor.take("<I"))]
            directory.append((name, tuple(reversed(dims)), cursor.take("<I"), cursor.take("<Q")))
        data_start = _aligned(cursor.pos, metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
    tensors, seen = [], set()
    for name, shape, qtype, relative in directory:
        if name in seen:
            raise ValueError(f"the tensor {name} appears twice")
        seen.add(name)
        tensors.append(GGUFTensorInfo(name, shape, qtype, data_start + relative))
    return GGUFHeader(metadata, tensors)


def read_gguf_header(path: Path) -> tuple[dict[str, object], dict[str, tuple[int, ...]]]:
    """A GGUF's key/values (arrays as their lengths, bool arrays as tuples) and tensor
    shapes (Hugging Face order); FolioLoadError when the file is not a readable GGUF."""
    try:
        header = parse_gguf_header(path)
    except (OSError, ValueError) as exc:
        raise FolioLoadError(f"{path}: not a readable GGUF file ({exc}); download or convert "
                             "it again") from exc
    return header.metadata, {tensor.name: tensor.shape for tensor in header.tensors}


def _aligned(pos: int, alignment: object) -> int:
    # The tensor data starts at the first multiple of the alignment after the directory.
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment must be a power of two, got {alignment!r}")
    return -(-pos // alignment) * alignment


class _Cursor:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: mmap.mmap, pos: int) -> None:
        self.buf, self.pos = buf, pos

    def take(self, fmt: str) -> int | float | bool:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ValueError(_TRUNCATED)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def raw_string(self) -> bytes:
        length = self.take("<Q")
        if self.pos + length > len(self.buf):
            raise ValueError(_TRUNCATED)
        self.pos += length
        return self.buf[self.pos - length:self.pos]

    def string(self) -> str:
        return self.raw_string().decode("utf-8")

    def array(self) -> list:
        """An array of strings or scalars, whole (its type and count read here)."""
        item, count = self.take("<I"), self.take("<Q")
        if item == _STRING:
            buf, pos, end, items = self.buf, self.pos, len(self.buf), []
            for _ in range(count):
                if pos + 8 > end:
                    raise ValueError(_TRUNCATED)
                length = int.from_bytes(buf[pos:pos + 8], "little")
                pos += 8 + length
                if pos > end:
                    raise ValueError(_TRUNCATED)
                # As llama.cpp reads them: bytes that are not UTF-8 are replaced.
                items.append(buf[pos - length:pos].decode("utf-8", errors="replace"))
            self.pos = pos
            return items
        if item not in _SCALARS or item == _BOOL:
            raise ValueError(f"an array of value type {item} cannot be read whole")
        fmt = f"<{count}{_SCALARS[item][1]}"
        if self.pos + struct.calcsize(fmt) > len(self.buf):
            raise ValueError(_TRUNCATED)
        items = list(struct.unpack_from(fmt, self.buf, self.pos))
        self.pos += struct.calcsize(fmt)
        return items

    def value(self, kind: int, per_layer: bool = False) -> object:
        """``per_layer``: a short array of integers is kept as a tuple (per-layer head
        counts and widths, Gemma 4's), not given as its length."""
        if kind == _STRING:
            # A stray byte in a value (a name, a chat template) should not make the whole
            # model unloadable; keys and tensor names above must decode exactly.
            return self.raw_string().decode("utf-8", errors="replace")
        if kind != _ARRAY:
            if kind not in _SCALARS:
                raise ValueError(f"unknown value type {kind}")
            return self.take(_SCALARS[kind])
        item, count = self.take("<I"), self.take("<Q")
        if item == _BOOL:  # per-layer flags (sliding_window_pattern): kept, they are short
            if self.pos + count > len(self.buf):
                raise ValueError(_TRUNCATED)
            self.pos += count
            return tuple(byte != 0 for byte in self.buf[self.pos - count:self.pos])
        if per_layer and item in _INTEGERS and count <= _MAX_LAYERS:
            return tuple(self.take(_SCALARS[item]) for _ in range(count))
        if item in _SCALARS:
            self.pos += count * struct.calcsize(_SCALARS[item])
        else:  # strings and nested arrays have per-item lengths to walk
            for _ in range(count):
                if item == _STRING:
                    length = self.take("<Q")  # read before `pos +=` loads pos
                    self.pos += length
                else:
                    self.value(item)
        if self.pos > len(self.buf):
            raise ValueError(_TRUNCATED)
        return count
