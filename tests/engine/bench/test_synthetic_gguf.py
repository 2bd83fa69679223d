"""The synthetic Q4_K_M writer of ``folio bench 8b``, on a tiny shape: gguf's own reader
reads the file back with the planned types and shapes, the starter's tokenizer keys, and
weights that dequantize to small finite values."""

from __future__ import annotations

import numpy as np
import pytest

from engine.bench.synthetic import (
    Shape,
    ensure_synthetic_gguf,
    tensor_nbytes,
    tensor_plan,
    use_more_bits,
)

TINY = Shape(layers=3, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512,
             context=512)


def test_q4_k_m_mix_follows_llama_cpp():
    # 32 layers: the first and last 4, and every third layer from 6: half of them.
    more = [i for i in range(32) if use_more_bits(i, 32)]
    assert more == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    plan = {name: (dims, kind) for name, dims, kind in tensor_plan(Shape(), 49152)}
    assert plan["blk.0.attn_v.weight"] == ((1024, 4096), "Q6_K")
    assert plan["blk.4.ffn_down.weight"] == ((4096, 14336), "Q4_K")
    assert plan["output.weight"] == ((49152, 4096), "Q6_K")
    assert plan["blk.7.attn_norm.weight"] == ((4096,), "F32")
    assert len(plan) == 2 + 32 * 9 + 1
    total = sum(tensor_nbytes(dims, kind) for dims, kind in plan.values())
    assert 4.0e9 < total < 4.6e9  # an 8B Q4_K_M with a 49k vocabulary


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from engine.loaders.catalog import starter_path

    root = tmp_path_factory.mktemp("synthetic")
    path, written = ensure_synthetic_gguf(starter_path(), TINY, root=root)
    assert written
    return path, starter_path()


def test_tiny_file_reads_back(tiny_gguf):
    import gguf

    from engine.loaders.gguf.header import parse_gguf_header

    path, starter = tiny_gguf
    assert not [p for p in path.parent.iterdir() if p != path]  # no temporary left behind
    reader = gguf.GGUFReader(path)
    vocab = parse_gguf_header(starter).metadata["tokenizer.ggml.tokens"]
    plan = tensor_plan(TINY, vocab)
    assert [t.name for t in reader.tensors] == [name for name, _, _ in plan]
    for tensor, (_, dims, kind) in zip(reader.tensors, plan, strict=True):
        assert tensor.tensor_type.name == kind
        assert tuple(int(d) for d in reversed(tensor.shape)) == dims  # GGUF lists inner first
        assert tensor.n_bytes == tensor_nbytes(dims, kind)
    fields = reader.fields
    assert fields["general.architecture"].contents() == "llama"
    assert fields["llama.block_count"].contents() == 3
    assert fields["llama.attention.head_count_kv"].contents() == 2
    assert len(fields["tokenizer.ggml.tokens"].data) == vocab
    assert fields["tokenizer.chat_template"].contents().startswith("{%")
    for tensor in reader.tensors[1:12]:
        if tensor.tensor_type.name == "F32":  # the norms: ones
            assert (tensor.data == 1).all()
            continue
        weights = gguf.dequantize(tensor.data, tensor.tensor_type)
        assert np.isfinite(weights).all() and np.abs(weights).max() < 1.0


def test_existing_file_is_reused(tiny_gguf):
    path, starter = tiny_gguf
    before = path.stat().st_mtime_ns
    again, written = ensure_synthetic_gguf(starter, TINY, root=path.parent)
    assert (again, written) == (path, False) and path.stat().st_mtime_ns == before


def test_a_written_file_leaves_the_page_cache(tmp_path, monkeypatch):
    """The writer's pages are flushed and dropped, so the first reader maps the file with
    2 MiB pages (engine/loaders/gguf/mapping.py), as it would after a restart."""
    import os

    from engine.bench import synthetic
    from engine.loaders.catalog import starter_path

    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise on this platform")
    advice = []
    real = os.posix_fadvise

    def recording(fd, offset, length, how):
        advice.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length, how))
        real(fd, offset, length, how)

    monkeypatch.setattr(os, "posix_fadvise", recording)
    path, written = synthetic.ensure_synthetic_gguf(starter_path(), TINY, root=tmp_path)
    assert written
    assert advice == [(str(path), 0, 0, os.POSIX_FADV_DONTNEED)]
