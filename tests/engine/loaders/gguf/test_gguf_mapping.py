"""The GGUF file's map (engine/loaders/gguf/mapping.py): the file's bytes, writable for
torch without reaching the file, and advised for huge pages."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from engine.loaders.gguf import mapping


def test_the_map_is_the_files_bytes_and_writes_stay_private(tmp_path):
    path = tmp_path / "weights.bin"
    data = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    mapped = mapping.map_weights(path)
    assert mapped.dtype == np.uint8 and mapped.flags.writeable
    assert np.array_equal(mapped, data)
    mapped[:16] = 7  # copy-on-write: the process sees it, the file does not
    assert (mapped[:16] == 7).all()
    assert path.read_bytes() == data.tobytes()


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no huge-page advice here")
def test_the_map_asks_for_huge_pages(tmp_path, monkeypatch):
    advised = []

    class Recording(mmap.mmap):
        def madvise(self, option, *args):
            advised.append(option)
            return super().madvise(option, *args)

    monkeypatch.setattr(mapping.mmap, "mmap", Recording)
    path = tmp_path / "weights.bin"
    path.write_bytes(b"GGUF" + bytes(1 << 20))
    mapped = mapping.map_weights(path)
    assert advised == [mmap.MADV_HUGEPAGE]
    assert bytes(mapped[:4]) == b"GGUF"
