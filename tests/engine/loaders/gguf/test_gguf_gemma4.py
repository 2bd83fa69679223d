"""Gemma 4 GGUF files, written here the way llama.cpp's convert_hf_to_gguf.py writes them
(Gemma4Model): the global layers' head size as key_length and the sliding ones' as
key_length_swa, KV heads and MLP widths per layer, the KV-shared layers and per-layer
embeddings by their keys, the proportional rope's rotated share in rope_freqs, norms as
stored, the layer scalar as a .weight tensor. The file loads to the folder's config,
weights and greedy replies; per-layer keys of the wrong length fail naming the key.
Quantized (Q8_0; Q4_K where a row holds whole 256-value blocks, Q8_0 elsewhere) and kept
as stored, a file replies as the folder of its own weights read back by gguf's dequantize:
this random model's first token already moves with Q8_0's rounding of its weights."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.constants import MODEL_ARCH

from engine import LLM, SamplingParams
from engine.loaders import FolioLoadError, load_model_files
from engine.models import build_model
from engine.models.gemma import FULL, SLIDING
from kernels.quant.formats import QuantizedTensor
from tests.engine.loaders.gguf.quantized_files import encode, file_type, held_folder
from tests.engine.loaders.gguf.test_gguf_families import (  # noqa: F401 - cache_dir: autouse
    byte_level_metadata,
    cache_dir,
    put,
)
from tests.engine.models.test_gemma4 import save_gemma4
from tests.engine.tiny_models import random_prompt, tiny_gemma4_config

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def gemma4_metadata(config) -> dict[str, object]:
    """The keys Gemma4Model.set_gguf_parameters writes (over Gemma 3's)."""
    types = config.layer_types
    full_dim = config.per_layer_config[types.index(FULL)].head_dim
    swa_dim = config.per_layer_config[types.index(SLIDING)].head_dim
    kv = [config.per_layer_config[i].num_key_value_heads for i in range(len(types))]
    first_shared = config.num_hidden_layers - config.num_kv_shared_layers
    widths = [config.intermediate_size * (2 if i >= first_shared else 1)
              for i in range(config.num_hidden_layers)]
    keys = {
        "context_length": config.max_position_embeddings,
        "block_count": config.num_hidden_layers, "embedding_length": config.hidden_size,
        "feed_forward_length": widths, "attention.head_count": config.num_attention_heads,
        "attention.head_count_kv": kv,
        "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        "attention.key_length": full_dim, "attention.value_length": full_dim,
        "attention.key_length_swa": swa_dim, "attention.value_length_swa": swa_dim,
        "rope.dimension_count": full_dim, "rope.dimension_count_swa": swa_dim,
        "rope.freq_base": float(config.rope_parameters[FULL]["rope_theta"]),
        "rope.freq_base_swa": float(config.rope_parameters[SLIDING]["rope_theta"]),
        "attention.sliding_window": config.sliding_window,
        "attention.sliding_window_pattern": [t == SLIDING for t in types],
        "final_logit_softcapping": float(config.final_logit_softcapping),
        "attention.shared_kv_layers": config.num_kv_shared_layers,
        "embedding_length_per_layer_input": config.hidden_size_per_layer_input,
    }
    return {f"gemma4.{name}": value for name, value in keys.items()}


def write_gemma4_gguf(path: Path, config, state: dict[str, torch.Tensor],
                      matrices: Q = Q.F32, metadata: dict[str, object] | None = None) -> None:
    name_map = gguf.get_tensor_name_map(MODEL_ARCH.GEMMA4, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), "gemma4")
    for key, value in {**gemma4_metadata(config), **byte_level_metadata(),
                       **(metadata or {})}.items():
        put(writer, key, value)
    for name, tensor in state.items():
        if name == "lm_head.weight":
            continue  # tied: the converter writes none
        data = tensor.numpy()
        if name.endswith("layer_scalar"):  # Gemma4Model.filter_tensors adds the suffix
            gguf_name = name_map.get_name(name) + ".weight"
        else:
            gguf_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        if data.ndim == 2 and matrices == Q.F16:
            writer.add_tensor(gguf_name, data.astype(np.float16))
            continue
        data, raw = encode(data, file_type(name, data.shape, matrices))
        writer.add_tensor(gguf_name, data, raw_dtype=raw)
    full_dim = config.per_layer_config[config.layer_types.index(FULL)].head_dim
    share = config.rope_parameters[FULL]["partial_rotary_factor"]
    turning = int(full_dim * share / 2)
    writer.add_tensor("rope_freqs.weight", np.array(
        [1.0] * turning + [1e30] * (full_dim // 2 - turning), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_gemma4(tmp_path_factory.mktemp("gemma4") / "folder", tiny_gemma4_config())


@pytest.fixture(scope="module")
def reference(folder):
    loaded = load_model_files(folder)
    return loaded, {name: t.clone() for name, t in loaded.weights}


@pytest.mark.parametrize("matrices", [Q.F32, Q.F16], ids=["f32", "f16"])
def test_the_file_gives_the_folders_spec_and_weights(reference, tmp_path, matrices):
    loaded, weights = reference
    path = tmp_path / "gemma4.gguf"
    write_gemma4_gguf(path, loaded.config, weights, matrices)
    from_file = load_model_files(path)
    assert from_file.config.model_type == "gemma4_text"
    spec = build_model(from_file.config, torch.float32, "meta").spec
    assert spec == build_model(loaded.config, torch.float32, "meta").spec
    file_weights = dict(from_file.weights)
    assert set(file_weights) == set(weights)
    for name, want in weights.items():
        if want.dim() == 2 and matrices == Q.F16:  # what the file holds
            want = want.half().float()
        assert torch.equal(file_weights[name], want), name


def test_the_engine_replies_the_same_from_the_file_and_the_folder(folder, reference,
                                                                  tmp_path):
    loaded, weights = reference
    path = tmp_path / "gemma4.gguf"
    write_gemma4_gguf(path, loaded.config, weights)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompt = random_prompt(3, 40)
    replies = [LLM(str(source), num_gpu_blocks=32).generate([prompt], params)[0]
               .outputs[0].token_ids for source in (folder, path)]
    assert replies[0] == replies[1]


@pytest.mark.parametrize("key", ["gemma4.attention.head_count_kv",
                                 "gemma4.feed_forward_length"])
def test_a_per_layer_key_of_the_wrong_length_names_the_key(reference, tmp_path, key):
    loaded, weights = reference
    path = tmp_path / "bad.gguf"
    write_gemma4_gguf(path, loaded.config, weights, metadata={key: [2, 2, 2]})
    with pytest.raises(FolioLoadError, match=key.replace(".", r"\.")):
        load_model_files(path)


@pytest.mark.parametrize("matrices", [Q.Q8_0, Q.Q4_K], ids=["q8_0", "q4_k"])
def test_a_quantized_file_replies_as_its_weights(tmp_path, matrices):
    sizes = {"hidden_size": 256} if matrices == Q.Q4_K else {}  # rows of whole Q4_K blocks
    folder = save_gemma4(tmp_path / "folder", tiny_gemma4_config(**sizes))
    loaded = load_model_files(folder)
    path = tmp_path / "gemma4.gguf"
    write_gemma4_gguf(path, loaded.config, dict(loaded.weights), matrices)
    kept = dict(load_model_files(path, keep_quantized=True).weights)
    assert matrices in {w.type_id for w in kept.values() if isinstance(w, QuantizedTensor)}
    folder = held_folder(folder, tmp_path / "held", matrices)
    # (16 tokens on the float16 cache: the native products' rounding of the activations
    # flips a near tie later, and sooner through the int8 cache's rounding)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    prompt = random_prompt(3, 40)
    replies = [LLM(str(source), num_gpu_blocks=32, kv_cache_dtype="float16")
               .generate([prompt], params)[0].outputs[0].token_ids for source in (folder, path)]
    assert replies[0] == replies[1]
