"""gpt-oss folders as released (engine/loaders/hf_mxfp4.py): MXFP4 experts repacked into
GGUF's blocks (exactly transformers' dequantization, by gguf's dequantize), kept quantized
in the storages GGUF files get, or dequantized at load for a dense `weights`; through the
engine greedy-equal to transformers on the same folder (Mxfp4Config(dequantize=True)),
across two turns sharing a prefix and with two candidates; the catalog's counts and the
memory figures in MXFP4 bytes; a quant_method Folio cannot read refused by name."""

from __future__ import annotations

import json
import random

import gguf
import numpy as np
import pytest
import torch
import transformers

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.loaders import FolioLoadError, load_model_files
from engine.loaders.catalog import model_info
from engine.models.gpt_oss import Mxfp4Experts
from engine.runner.kv_cache import estimate_memory
from kernels.quant.mxfp4 import MXFP4_TYPE, from_hf_blocks
from tests.engine.mxfp4_folder import save_mxfp4_gpt_oss_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
PROMPT = [random.Random(3).randrange(256) for _ in range(40)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    save_mxfp4_gpt_oss_model(path)
    return path


@pytest.fixture(scope="module")
def reference(folder):
    """transformers' own load of the folder, its experts dequantized."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=transformers.Mxfp4Config(dequantize=True),
        dtype=torch.float32, attn_implementation="eager").eval()


@pytest.fixture(params=["pytorch", "native"])
def mxfp4_path(request, monkeypatch):
    """Each CPU storage of MXFP4 blocks: PyTorch's dequantization, the native kernel."""
    import kernels.quant.mxfp4 as mxfp4

    if request.param == "native" and not mxfp4.native_mxfp4(torch.device("cpu")):
        pytest.skip("the native CPU library (with its MXFP4 kernel) is not built")
    if request.param == "pytorch":
        monkeypatch.setattr(mxfp4, "_library_takes_mxfp4", lambda: False)
    return request.param


def hf_greedy(model, prompt: list[int], tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def test_repacked_blocks_dequantize_as_transformers_does():
    """Every code byte and every E8M0 scale up to 2^123 (the subnormal halves of 0 and 1
    included; beyond, 6 times the scale leaves float32), through gguf's MXFP4 dequantize,
    equals transformers' dequantization of the folder's blocks, value for value."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    generator = torch.Generator().manual_seed(0)
    rows = 251
    blocks = torch.randint(0, 256, (2, rows, 3, 16), dtype=torch.uint8, generator=generator)
    blocks[0, :16, 0] = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    scales = torch.randint(0, rows, (2, rows, 3), dtype=torch.uint8, generator=generator)
    scales[0, :, 0] = torch.arange(rows, dtype=torch.uint8)
    expected = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, k, out]
    repacked = from_hf_blocks(blocks, scales)
    assert repacked.shape == (2, rows, 3 * 17)
    ours = gguf.quants.dequantize(repacked.reshape(2 * rows, -1).numpy(),
                                  gguf.GGMLQuantizationType.MXFP4)
    ours = torch.from_numpy(ours).reshape(2, rows, 96).transpose(1, 2)
    assert torch.equal(ours, expected)  # gguf's table reads code 8 as +0.0, equal to -0.0


def test_kept_quantized_the_experts_stay_mxfp4_blocks(folder, mxfp4_path):
    loaded = load_model_files(folder, keep_quantized=True)
    weights = dict(loaded.weights)
    experts = weights["model.layers.0.mlp.experts.gate_up_proj"]
    assert isinstance(experts, Mxfp4Experts)
    assert not any(name.endswith(("_blocks", "_scales")) for name in weights)
    config = loaded.config
    hidden, inter = config.hidden_size, config.intermediate_size
    assert experts.shape == (8, hidden, 2 * inter)
    assert experts.blocks.dtype == torch.uint8
    assert experts.blocks.shape == (8, 2 * inter, hidden // 32 * 17)
    dense = dict(load_model_files(folder).weights)["model.layers.0.mlp.experts.gate_up_proj"]
    torch.testing.assert_close(experts.dequantize(torch.float32), dense, atol=0, rtol=0)
    gate = experts.matrix(3, slice(0, None, 2))
    assert gate.type_id == MXFP4_TYPE and gate.shape == (inter, hidden)


def test_the_engine_holds_the_experts_in_mxfp4_bytes(folder, mxfp4_path):
    llm = LLM(str(folder), num_gpu_blocks=16)
    net = llm.engine.runner.model
    config = llm.engine.hf_config
    hidden, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    storage = net.layers[0].mlp.experts[0].gate_up_proj.storage
    assert storage.runs[0].tensor.type_id == MXFP4_TYPE
    assert net.layers[0].mlp.experts[0].gate_up_proj.weight.numel() == 0  # no float copy
    blocks = layers * 8 * (2 * inter * hidden + hidden * inter) // 32 * 17
    biases = layers * 8 * (2 * inter + hidden) * 4
    assert llm.memory_stats().expert_bytes == blocks + biases
    info = model_info(folder)
    estimate = estimate_memory(info, EngineConfig(device="cpu"))
    dense = estimate_memory(info, EngineConfig(device="cpu", weights="float32"))
    assert info.mxfp4.nbytes == blocks
    assert dense.weights_bytes - estimate.weights_bytes == info.mxfp4.parameters * 4 - blocks


def test_greedy_equals_transformers_on_the_same_folder(folder, reference, mxfp4_path):
    llm = LLM(str(folder), num_gpu_blocks=32)
    [out] = llm.generate([PROMPT], GREEDY)
    assert out.outputs[0].token_ids == hf_greedy(reference, PROMPT, GREEDY.max_tokens)


def test_dense_weights_dequantize_the_experts_at_load(folder, reference):
    llm = LLM(str(folder), num_gpu_blocks=32, weights="float32")
    expert = llm.engine.runner.model.layers[0].mlp.experts[0].gate_up_proj
    assert not expert.quantized
    [out] = llm.generate([PROMPT], GREEDY)
    assert out.outputs[0].token_ids == hf_greedy(reference, PROMPT, GREEDY.max_tokens)


def test_a_second_turn_reuses_the_first_and_two_candidates_agree(folder, reference,
                                                                  mxfp4_path):
    llm = LLM(str(folder), num_gpu_blocks=32)
    first = llm.generate([PROMPT], GREEDY)[0].outputs[0].token_ids
    second_prompt = PROMPT + first + [random.Random(4).randrange(256) for _ in range(9)]
    params = SamplingParams(n=2, max_tokens=12, temperature=0, ignore_eos=True)
    [second] = llm.generate([second_prompt], params)
    assert second.metrics.num_cached_tokens >= 48
    expected = hf_greedy(reference, second_prompt, 12)
    assert [c.token_ids for c in second.outputs] == [expected, expected]


def test_the_catalog_shows_the_folder_as_gpt_oss_with_its_parameters(folder, reference):
    from desktop_app.dialogs.model_rows import format_parameters

    info = model_info(folder)
    total = sum(p.numel() for p in reference.parameters())
    experts = sum(p.numel() for name, p in reference.named_parameters() if ".experts." in name)
    assert info.architecture == "gpt_oss" and info.error == ""
    assert (info.num_parameters, info.active_parameters) == (total,
                                                             total - experts + experts * 2 // 8)
    assert format_parameters(info.num_parameters, info.active_parameters).startswith("MoE: ")
    assert info.mxfp4.parameters == sum(
        p.numel() for name, p in reference.named_parameters()
        if name.endswith(("gate_up_proj", "down_proj")))


def _with_quantization(folder, tmp_path, quantization):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    config["quantization_config"] = quantization
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_a_quant_method_folio_cannot_read_is_named(folder, tmp_path):
    copy = _with_quantization(folder, tmp_path, {"quant_method": "gptq", "bits": 4})
    with pytest.raises(FolioLoadError, match="quant_method 'gptq'"):
        load_model_files(copy)
    with pytest.raises(FolioLoadError, match="quant_method 'gptq'"):
        model_info(copy)


def test_half_a_pair_is_an_incomplete_download(folder, tmp_path):
    from safetensors.torch import load_file, save_file

    copy = _with_quantization(folder, tmp_path, {"quant_method": "mxfp4"})
    state = load_file(str(copy / "model.safetensors"))
    del state["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(state, str(copy / "model.safetensors"))
    with pytest.raises(FolioLoadError, match="down_proj_scales"):
        load_model_files(copy)


def test_blocks_and_scales_must_agree():
    blocks = np.zeros((1, 2, 3, 16), np.uint8)
    with pytest.raises(ValueError, match="scales"):
        from_hf_blocks(torch.from_numpy(blocks), torch.zeros(1, 2, 4, dtype=torch.uint8))
