"""A gpt-oss GGUF file's MXFP4 experts loaded with the storage a CUDA load picks
(Triton's, here interpreted on CPU): the loader's `SparseMoE.prepare` gives every layer
the fused Triton method, and the model's logits stay the Hugging Face folder's given the
experts as the file holds them."""

from __future__ import annotations

import pytest
import torch

import kernels.triton.fused_moe as fused_moe_module
from engine.layers import weights as storages
from engine.loaders import load_model_files
from kernels.quant.matrix import RawBlocks
from tests.engine.loaders.gguf.test_gguf_families import prefill_logits
from tests.engine.loaders.gguf.test_gguf_gpt_oss import write_gpt_oss_gguf
from tests.engine.tiny_moe import GPT_OSS, save_moe_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def test_a_cuda_like_load_runs_every_layer_fused(tmp_path, monkeypatch,
                                                 build_attention_metadata):
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "hf"
    hf = save_moe_model(source, GPT_OSS, max_position_embeddings=128)
    state = {name: t.detach().clone() for name, t in hf.state_dict().items()}
    path = tmp_path / "gpt-oss.gguf"
    held = write_gpt_oss_gguf(path, hf.config, state)
    expected, _ = prefill_logits(load_model_files(source).config, held.items(),
                                 build_attention_metadata)

    monkeypatch.setattr(storages, "_quantized_kind", lambda device: storages.TritonQuantized)
    monkeypatch.setattr(storages, "for_product",
                        lambda tensor, device: RawBlocks(tensor.in_order(), triton=True))
    calls = []
    real = fused_moe_module.fused_moe

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(fused_moe_module, "fused_moe", counted)
    loaded = load_model_files(path, keep_quantized=True)
    logits, _ = prefill_logits(loaded.config, loaded.weights, build_attention_metadata)
    assert len(calls) == hf.config.num_hidden_layers
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)
