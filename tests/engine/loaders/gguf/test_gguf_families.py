"""Gemma 2, Gemma 3 and Phi-3 GGUF files, written here the way llama.cpp's
convert_hf_to_gguf.py writes them (Gemma2Model, Gemma3Model, Phi3MiniModel): gguf's own
tensor-name map, Gemma's +1 on every norm weight, Phi-3's fused matrices and LongRoPE factor
tensors, matrices as F32, F16 or Q8_0 (norms stay F32, as llama.cpp keeps 1-D tensors).

Each file loads to exactly the logits of the Hugging Face folder it was converted from: the
F32 file against the folder itself, the F16 / Q8_0 files against the folder's model given
the dequantized matrices (what the file holds). Exact is achievable for the norms too: the
file holds fl(w + 1), the loader gives back fl(w + 1) - 1 (exact by Sterbenz for w in
[-0.5, 1]), and GemmaRMSNorm's 1 + that is fl(w + 1) again, the scale the folder's model
computes. Then bad family keys fail naming the key.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from gguf.constants import MODEL_ARCH

from engine.loaders import FolioLoadError, load_model_files
from engine.loaders.gguf.config import gguf_config_dict
from engine.loaders.gguf.tokenizer import convert_with_transformers
from engine.models import build_model, gguf_family
from engine.models.base import pool_layers
from engine.models.gemma import FULL, SLIDING
from engine.text.file_tokenizer import FileTokenizer
from kernels import allocate_kv_cache
from kernels.reference.backend import TorchBackend
from tests.engine.text.test_file_tokenizer import assert_same
from tests.engine.tiny_models import CHATML, byte_level_tokenizer, tiny_gemma_config

pytestmark = pytest.mark.usefixtures("single_torch_thread")

BLOCK = 16
PROMPT = [random.Random(0).randrange(0, 256) for _ in range(37)]  # crosses 16-token windows
ORIGINAL = 32  # Phi-4-like LongRoPE: the prompt is longer, so the long factors run
ARCHS = {"gemma2": MODEL_ARCH.GEMMA2, "gemma3": MODEL_ARCH.GEMMA3, "phi3": MODEL_ARCH.PHI3}


def _phi3_config(**fields: Any) -> transformers.Phi3Config:
    return transformers.Phi3Config(**{**dict(
        vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=256, eos_token_id=258,
        pad_token_id=256), **fields})


def _longrope_attention_factor() -> float:
    # Phi3MiniModel computes it, whatever the config says, and the file keeps its float32;
    # the folder states that same value so that both run the same rope tables.
    scale = 128 / ORIGINAL
    return float(np.float32(math.sqrt(1 + math.log(scale) / math.log(ORIGINAL))))


VARIANTS = {
    # Window 16 on alternate layers, soft-caps 3 and 8, tied embeddings.
    "gemma2": ("gemma2", lambda: tiny_gemma_config(2)),
    # Six layers in llama.cpp's default 5:1 pattern (no pattern key), q/k norms, linear
    # scaling on the full layer's rope (base 1e6) and base 10000 on the sliding ones.
    "gemma3": ("gemma3", lambda: tiny_gemma_config(3, num_hidden_layers=6, layer_types=None)),
    # Phi-3-mini-4k: full rotary, a sliding window (2047 there), untied LM head.
    "phi3": ("phi3", lambda: _phi3_config(sliding_window=16, tie_word_embeddings=False)),
    # Phi-4-mini: 12 of 16 head dims rotate, LongRoPE, tied embeddings, no window.
    "phi4": ("phi3", lambda: _phi3_config(
        partial_rotary_factor=0.75, tie_word_embeddings=True,
        original_max_position_embeddings=ORIGINAL, rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.125 * i for i in range(6)],
            "long_factor": [1.0 + 4.0 * i for i in range(6)],
            "attention_factor": _longrope_attention_factor()})),
}


def random_model(config, seed: int = 0) -> transformers.PreTrainedModel:
    """Peaked logits (large matrices) and norms far from their init, kept in [-0.45, 0.95]
    so that Gemma's +1 / -1 round trip is exact (see the module docstring)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                param.copy_((0.3 * noise).clamp(-0.45, 0.95))
            else:
                param.copy_(noise * 0.08)
    return model


def family_metadata(arch: str, config) -> dict[str, object]:
    """The keys convert_hf_to_gguf.py writes for the family (gguf.Keys names)."""
    keys: dict[str, object] = {
        "context_length": config.max_position_embeddings, "block_count": config.num_hidden_layers,
        "embedding_length": config.hidden_size, "feed_forward_length": config.intermediate_size,
        "attention.head_count": config.num_attention_heads,
        "attention.head_count_kv": config.num_key_value_heads,
        "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
    }
    if arch == "gemma2":  # Gemma2Model.set_gguf_parameters (no rope keys: base 10000)
        keys |= {"attention.key_length": config.head_dim,
                 "attention.value_length": config.head_dim,
                 "attn_logit_softcapping": float(config.attn_logit_softcapping),
                 "final_logit_softcapping": float(config.final_logit_softcapping),
                 "attention.sliding_window": config.sliding_window}
    elif arch == "gemma3":  # TextModel's keys (the global rope), then Gemma3Model's
        full = config.rope_parameters[FULL]
        keys |= {"attention.key_length": config.head_dim,
                 "attention.value_length": config.head_dim,
                 "rope.freq_base": float(full["rope_theta"]),
                 "rope.scaling.type": full["rope_type"], "rope.scaling.factor": full["factor"],
                 "attention.sliding_window": config.sliding_window}
    else:  # Phi3MiniModel.set_gguf_parameters and generate_extra_tensors
        rotary = int(config.rope_parameters.get("partial_rotary_factor", 1.0)
                     * config.hidden_size) // config.num_attention_heads
        keys |= {"rope.dimension_count": rotary,
                 "rope.freq_base": float(config.rope_parameters["rope_theta"]),
                 "rope.scaling.original_context_length":
                     config.original_max_position_embeddings,
                 "attention.sliding_window": config.sliding_window or 0}
        if config.rope_parameters.get("rope_type") == "longrope":
            keys["rope.scaling.attn_factor"] = _longrope_attention_factor()
    return {f"{arch}.{name}": value for name, value in keys.items()}


def byte_level_metadata() -> dict[str, object]:
    """The tiny folders' byte-level BPE vocabulary as a GGUF gpt2 tokenizer."""
    vocab = byte_level_tokenizer().get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
            # No merges in this vocabulary: scores instead, from which none are derived.
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": [0.0] * len(tokens),
            "tokenizer.ggml.token_type": [3 if t.startswith("<|") else 1 for t in tokens],
            "tokenizer.ggml.bos_token_id": 256, "tokenizer.ggml.eos_token_id": 258,
            "tokenizer.ggml.padding_token_id": 256, "tokenizer.chat_template": CHATML}


def put(writer: gguf.GGUFWriter, key: str, value: object) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        (writer.add_uint32 if value >= 0 else writer.add_int32)(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:  # token types as int32, scores as float32, tokens as strings, flags as bools
        writer.add_array(key, list(value))


def write_tensors(path: Path, arch: str, metadata: dict[str, object],
                  tensors: dict[str, np.ndarray], matrices: Q,
                  quantized: Callable[[str, np.ndarray], bool]) -> None:
    """A GGUF of `arch` with `metadata` and `tensors`, those `quantized` picks stored as
    `matrices` (all as they are for F32)."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        put(writer, key, value)
    for name, data in tensors.items():
        if matrices != Q.F32 and quantized(name, data):
            writer.add_tensor(name, gguf.quants.quantize(data, matrices), raw_dtype=matrices)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def round_trip(data: np.ndarray, matrices: Q) -> torch.Tensor:
    """`data` as a file holding it in `matrices` gives it back (dequantized)."""
    back = gguf.quants.dequantize(gguf.quants.quantize(data, matrices), matrices)
    return torch.from_numpy(back.reshape(data.shape))


def write_gguf(path: Path, arch: str, config, state: dict[str, torch.Tensor], matrices: Q,
               metadata: dict[str, object] | None = None,
               extra: dict[str, np.ndarray] | None = None) -> dict[str, torch.Tensor]:
    """Convert `state` as llama.cpp would (`metadata` instead of the family's keys, `extra`
    tensors besides); returns the state the file holds (matrices dequantized, norms as the
    folder's: what the F16 / Q8_0 reference runs)."""
    name_map = gguf.get_tensor_name_map(ARCHS[arch], config.num_hidden_layers)
    base = {**family_metadata(arch, config), **byte_level_metadata()}
    tensors: dict[str, np.ndarray] = {}
    held = {}
    for name, tensor in state.items():
        if name == "lm_head.weight" and (arch.startswith("gemma") or config.tie_word_embeddings):
            continue  # Gemma's converter skips lm_head; a tied model has none
        data = tensor.numpy()
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            data = data + np.float32(1)  # `data_torch = data_torch + 1` in Gemma*Model
        gguf_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        if data.ndim == 1 or matrices == Q.F32:
            tensors[gguf_name] = data
            held[name] = tensor
        elif matrices == Q.F16:
            tensors[gguf_name] = data.astype(np.float16)
            held[name] = torch.from_numpy(data.astype(np.float16).astype(np.float32))
        else:
            tensors[gguf_name] = data
            held[name] = round_trip(data, matrices)
    rope = config.rope_parameters if arch == "phi3" else {}
    if rope.get("rope_type") == "longrope":
        for kind in ("long", "short"):
            tensors[f"rope_factors_{kind}.weight"] = np.array(rope[f"{kind}_factor"],
                                                              dtype=np.float32)
    extras = set(extra or ())
    tensors |= extra or {}
    # Quantized: the matrices of `state`, unless F16 (converted above).
    write_tensors(path, arch, base if metadata is None else metadata, tensors, matrices,
                  lambda name, data: matrices != Q.F16 and data.ndim > 1
                  and name not in extras)
    return held


def prefill_logits(config, weights, build_attention_metadata) -> tuple[torch.Tensor, Any]:
    """Our model for `config` given `weights`, run over PROMPT in one prefill."""
    model = build_model(config, torch.float32, "cpu")
    model.load_weights(weights)
    spec = model.spec
    blocks = -(-len(PROMPT) // BLOCK)
    kv = allocate_kv_cache(spec.num_layers, blocks, BLOCK, spec.num_kv_heads, spec.head_dim,
                           torch.float32, "cpu", head_major=False)
    meta = build_attention_metadata([list(range(blocks))], [0], [len(PROMPT)], BLOCK)
    with torch.inference_mode():
        hidden = model(torch.tensor(PROMPT), torch.arange(len(PROMPT)),
                       pool_layers(kv, meta), meta,
                       TorchBackend())
        return model.compute_logits(hidden), spec


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module", params=list(VARIANTS))
def converted(request, tmp_path_factory, build_attention_metadata):
    """A variant's folder, its model, and its logits through our engine (the reference)."""
    arch, make_config = VARIANTS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    hf = random_model(make_config())
    hf.save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    reference = load_model_files(folder)
    logits, spec = prefill_logits(reference.config, reference.weights, build_attention_metadata)
    state = {name: t.detach().clone() for name, t in hf.state_dict().items()}
    return SimpleNamespace(arch=arch, config=hf.config, state=state, folder=reference,
                           logits=logits, spec=spec)


@pytest.mark.parametrize("matrices", [Q.F32, Q.F16, Q.Q8_0], ids=["f32", "f16", "q8_0"])
def test_gguf_gives_the_folders_logits(converted, matrices, tmp_path,
                                       build_attention_metadata):
    c = converted
    path = tmp_path / f"{c.arch}.gguf"
    held = write_gguf(path, c.arch, c.config, c.state, matrices)
    loaded = load_model_files(path)
    assert loaded.config.model_type == c.folder.config.model_type
    weights = dict(loaded.weights)
    assert set(weights) == set(held) == set(c.folder.weights.shapes)
    for name, want in held.items():  # norms: (w + 1) - 1, within float32's step near 1
        assert torch.allclose(weights[name], want, rtol=0, atol=2 ** -23), name
    logits, spec = prefill_logits(loaded.config, weights.items(), build_attention_metadata)
    assert spec == c.spec  # the file's keys give the folder's config.json, quirks included
    if matrices == Q.F32:
        assert torch.equal(logits, c.logits)
    else:  # the folder's model, given the matrices the file holds
        expected, _ = prefill_logits(c.folder.config, held.items(), build_attention_metadata)
        assert torch.equal(logits, expected)
        # and the quantization is not what the comparison hides: the F32 logits are near
        # (max |logit| is about 2 here; seen: F16 <= 0.003, Q8_0 <= 0.05)
        assert (logits - c.logits).abs().max() < (0.02 if matrices == Q.F16 else 0.15)
    # The tokenizer and chat template come from the file, as the folder's.
    text = "hello, world"
    assert loaded.tokenizer.encode(text) == c.folder.tokenizer.encode(text)
    assert loaded.tokenizer.chat_template == CHATML


def test_the_engine_chats_the_same_from_the_file_and_the_folder(converted, tmp_path):
    """engine.LLM end to end: the file's chat template and tokenizer, then greedy decoding
    past the window and (Phi-4-like) the LongRoPE switch, token for token."""
    from engine import LLM, SamplingParams

    c = converted
    path = tmp_path / f"{c.arch}.gguf"
    write_gguf(path, c.arch, c.config, c.state, Q.F32)
    messages = [{"role": "user", "content": "hello, world"}]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    replies = [LLM(str(source), num_gpu_blocks=16).chat(messages, params).outputs[0]
               for source in (c.folder.source, path)]
    assert replies[0].token_ids == replies[1].token_ids


@pytest.mark.parametrize("arch", list(ARCHS))
def test_the_registry_maps_the_block_tensors_llama_cpp_lists(arch):
    listed = {name.removeprefix("blk.{bid}.") for name in
              (gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[ARCHS[arch]])
              if name.startswith("blk.")}
    mapped = set(gguf_family(arch).gguf_block_names)
    # Phi-3 files may also split q/k/v (llama.cpp reads either); Folio's model takes the
    # fused matrix that convert_hf_to_gguf.py writes, so a split file fails naming attn_q.
    assert mapped == (listed - {"attn_q", "attn_k", "attn_v"} if arch == "phi3" else listed)


# -- config keys ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def states() -> dict[str, tuple[Any, dict[str, torch.Tensor]]]:
    """Each variant's config and a random state (weights do not matter to the keys)."""
    out = {}
    for variant, (_, make_config) in VARIANTS.items():
        config = make_config()
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config)
        out[variant] = (config, {n: t.detach() for n, t in model.state_dict().items()})
    return out


def header_config(path: Path) -> dict[str, object]:
    """The config dict from the file's header alone, as the models catalog reads it."""
    from engine.loaders.gguf.header import read_gguf_header

    metadata, shapes = read_gguf_header(path)
    return gguf_config_dict(metadata, set(shapes), None, path)


def with_keys(variant: str, config, **changes: object) -> dict[str, object]:
    """The variant's metadata with keys (named without the `arch.` prefix, dots as __)
    replaced, or dropped when given None."""
    arch = VARIANTS[variant][0]
    metadata = {**family_metadata(arch, config), **byte_level_metadata()}
    for name, value in changes.items():
        key = f"{arch}.{name.replace('__', '.')}"
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    return metadata


S, F = SLIDING, FULL


@pytest.mark.parametrize(("pattern", "layer_types"), [
    (None, [S, S, S, S, S, F]),  # llama.cpp's Gemma 3 default, 5 sliding : 1 full
    (3, [S, S, F, S, S, F]),
    (0, [S] * 6),  # llama.cpp's set_swa_pattern(0): every layer slides
    ((True, False, True, True, False, False), [S, F, S, S, F, F]),  # per-layer flags
], ids=["default", "period-3", "period-0", "flags"])
def test_gemma3_layer_types_follow_the_sliding_window_pattern(states, tmp_path, pattern,
                                                              layer_types):
    config, state = states["gemma3"]
    path = tmp_path / "g3.gguf"
    metadata = with_keys("gemma3", config, attention__sliding_window_pattern=pattern)
    write_gguf(path, "gemma3", config, state, Q.F32, metadata)
    built = header_config(path)
    assert built["layer_types"] == layer_types and built["sliding_window"] == 16
    assert built["rope_parameters"] == {
        S: {"rope_type": "default", "rope_theta": 10000.0},
        F: {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 4.0}}


def test_gemma3_all_full_layers_need_no_window_and_read_the_optional_keys(states, tmp_path):
    config, state = states["gemma3"]
    path = tmp_path / "g3.gguf"
    # pattern 1: no sliding layer, so (as Gemma3Model) no window key; a final soft-cap and
    # a local rope base when the file states them.
    metadata = with_keys("gemma3", config, attention__sliding_window_pattern=1,
                         attention__sliding_window=None, final_logit_softcapping=30.0,
                         rope__freq_base_swa=20000.0)
    write_gguf(path, "gemma3", config, state, Q.F32, metadata)
    built = header_config(path)
    assert built["layer_types"] == [F] * 6 and built["sliding_window"] is None
    assert built["final_logit_softcapping"] == 30.0
    assert built["rope_parameters"][S]["rope_theta"] == 20000.0


@pytest.mark.parametrize(("arch", "layers", "hidden", "heads", "head_dim", "scalar"), [
    ("gemma2", 46, 4608, 32, 128, 144),  # gemma-2-27b: hidden / heads
    ("gemma2", 42, 3584, 16, 256, 256),  # gemma-2-9b: head_dim
    ("gemma3", 62, 5376, 32, 128, 168),  # gemma-3-27b: hidden / heads
    ("gemma3", 26, 1152, 4, 256, 256),  # gemma-3-1b: head_dim (hidden / heads is 288)
])
def test_query_pre_attn_scalar_follows_llama_cpp(arch, layers, hidden, heads, head_dim,
                                                  scalar):
    metadata = {"general.architecture": arch, "tokenizer.ggml.tokens": 262144,
                f"{arch}.block_count": layers, f"{arch}.embedding_length": hidden,
                f"{arch}.attention.head_count": heads, f"{arch}.attention.head_count_kv": 8,
                f"{arch}.attention.key_length": head_dim, f"{arch}.feed_forward_length": 1,
                f"{arch}.context_length": 8192, f"{arch}.attention.sliding_window": 4096,
                f"{arch}.attn_logit_softcapping": 50.0, f"{arch}.final_logit_softcapping": 30.0}
    config = gguf_config_dict(metadata, set(), None, Path("m.gguf"))
    assert config["query_pre_attn_scalar"] == scalar


def test_phi3_reads_partial_rotary_window_and_longrope(states, tmp_path):
    config, state = states["phi4"]
    path = tmp_path / "phi4.gguf"
    write_gguf(path, "phi3", config, state, Q.F32)
    built = load_model_files(path).config
    assert built.rope_parameters["partial_rotary_factor"] == 0.75
    assert built.rope_parameters["rope_type"] == "longrope"
    assert built.rope_parameters["long_factor"] == [1.0 + 4.0 * i for i in range(6)]
    assert built.rope_parameters["attention_factor"] == _longrope_attention_factor()
    assert built.original_max_position_embeddings == ORIGINAL
    assert built.sliding_window is None  # the converter's 0
    # The catalog reads sizes without the factor tensors, and does not count them.
    assert "rope_scaling" not in header_config(path)
    config, state = states["phi3"]
    write_gguf(path, "phi3", config, state, Q.F32)
    assert load_model_files(path).config.sliding_window == 16


BAD_KEYS = [  # (variant, key without the arch, value or None to drop it, complaint)
    ("gemma2", "attention.sliding_window", None, "is missing"),
    ("gemma2", "attention.sliding_window", -4096, "is -4096, not a positive integer"),
    ("gemma2", "attention.sliding_window", 4096.0, "is 4096.0, not a positive integer"),
    ("gemma2", "attn_logit_softcapping", "50", "is '50', not a positive number"),
    ("gemma2", "attn_logit_softcapping", None, "is missing"),
    ("gemma2", "final_logit_softcapping", -30.0, "is -30.0, not a positive number"),
    ("gemma3", "attention.sliding_window", None, "is missing"),
    ("gemma3", "attention.sliding_window", 0, "is 0, not a positive integer"),
    ("gemma3", "attention.sliding_window_pattern", "6", "is '6', not a layer period"),
    ("gemma3", "attention.sliding_window_pattern", (True, False),
     "is 2 flags, not one flag per layer (6)"),
    ("gemma3", "final_logit_softcapping", float("inf"), "is inf, not a positive number"),
    ("phi3", "attention.sliding_window", -1, "is -1, not an integer >= 0"),
    ("phi3", "attention.sliding_window", "2047", "is '2047', not an integer >= 0"),
    ("phi3", "rope.dimension_count", 15, "is 15, not an even number of dims"),
    ("phi4", "rope.scaling.attn_factor", -1.0, "is -1.0, not a positive number"),
]


@pytest.mark.parametrize(("variant", "key", "value", "complaint"), BAD_KEYS,
                         ids=[f"{v}-{k}-{x!r}" for v, k, x, _ in BAD_KEYS])
def test_bad_family_key_names_the_key(states, tmp_path, variant, key, value, complaint):
    config, state = states[variant]
    path = tmp_path / "bad.gguf"
    arch = VARIANTS[variant][0]
    metadata = with_keys(variant, config, **{key.replace(".", "__"): value})
    write_gguf(path, arch, config, state, Q.F32, metadata)
    with pytest.raises(FolioLoadError) as err:
        load_model_files(path)
    message = str(err.value)
    assert message.startswith(f"{path}: metadata {arch}.{key} {complaint}"), message


@pytest.mark.parametrize(("factors", "complaint"), [
    ({"rope_factors_long.weight": np.ones(8, np.float32)},
     "tensor rope_factors_short.weight is missing while rope_factors_long.weight is there"),
    ({"rope_factors_long.weight": np.ones(5, np.float32),
      "rope_factors_short.weight": np.ones(5, np.float32)},
     "tensor rope_factors_long.weight has shape [5], but phi3.rope.dimension_count 16 "
     "implies [8] finite factors"),
], ids=["half", "short"])
def test_bad_longrope_tensors_are_named(states, tmp_path, factors, complaint):
    config, state = states["phi3"]
    path = tmp_path / "rope.gguf"
    write_gguf(path, "phi3", config, state, Q.F32, extra=factors)
    with pytest.raises(FolioLoadError) as err:
        load_model_files(path)
    assert str(err.value).startswith(f"{path}: {complaint}"), str(err.value)


# -- tokenizers ----------------------------------------------------------------------------

# Real Gemma and Phi-3 files hold a sentencepiece vocabulary (tokenizer.ggml.model "llama",
# no merges): transformers rebuilds the merges from the token order (Gemma) or the scores.
# These list each merge's result after its parts, so "hello world" merges to two pieces.
PIECES = ["he", "ll", "hell", "hello", "\u2581hello", "\u2581w", "or", "\u2581wor",
          "\u2581worl", "\u2581world"]
SPM_SPECIALS = {"gemma": ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
                "phi3": ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"]}
SPM_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def sentencepiece_metadata(specials: list[str], bos: int, eos: int) -> dict[str, object]:
    tokens = specials + ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + PIECES
    types = [2 if t == "<unk>" else 3 for t in specials] + [1] * (len(tokens) - len(specials))
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [-float(i) for i in range(len(tokens))],
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": bos,
            "tokenizer.ggml.eos_token_id": eos, "tokenizer.ggml.add_space_prefix": False,
            "tokenizer.chat_template": SPM_TEMPLATE}


@pytest.mark.parametrize(("arch", "pieces", "special"), [
    ("gemma2", ["<bos>", "hello", "\u2581world"], "<start_of_turn>"),
    ("gemma3", ["<bos>", "hello", "\u2581world"], "<start_of_turn>"),
    # Phi-3's normalizer puts a space before the text
    ("phi3", ["<s>", "\u2581hello", "\u2581world"], "<|user|>"),
])
def test_sentencepiece_tokenizers_of_the_families_convert(tmp_path, arch, pieces, special):
    kind = "phi3" if arch == "phi3" else "gemma"
    metadata = sentencepiece_metadata(SPM_SPECIALS[kind], bos=1 if kind == "phi3" else 2,
                                      eos=2 if kind == "phi3" else 1)
    vocab = len(metadata["tokenizer.ggml.tokens"])
    ids = dict(vocab_size=vocab, bos_token_id=metadata["tokenizer.ggml.bos_token_id"],
               eos_token_id=metadata["tokenizer.ggml.eos_token_id"], pad_token_id=0)
    config = (_phi3_config(**ids) if kind == "phi3"
              else tiny_gemma_config(int(arch[-1]), **ids))
    torch.manual_seed(0)
    state = transformers.AutoModelForCausalLM.from_config(config).state_dict()
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, arch, config, state, Q.F32, {**family_metadata(arch, config), **metadata})
    tokenizer = load_model_files(path).tokenizer
    encoded = tokenizer.encode("hello world")
    assert tokenizer.convert_ids_to_tokens(encoded) == pieces
    assert tokenizer.decode(encoded, skip_special_tokens=True) == "hello world"
    assert special in tokenizer.convert_ids_to_tokens(tokenizer.encode(f"{special}hello"))
    assert tokenizer.chat_template == SPM_TEMPLATE
    # Built here (Phi-3) or converted by transformers' Gemma class and kept as Folio's
    # object, which answers as that class does.
    assert type(tokenizer) is FileTokenizer
    if kind == "gemma":
        assert_same(tokenizer, convert_with_transformers(path))


def test_a_tokenizer_transformers_cannot_build_is_a_load_error(states, tmp_path):
    config, state = states["gemma2"]
    path = tmp_path / "bert.gguf"
    metadata = {**family_metadata("gemma2", config), **byte_level_metadata(),
                "tokenizer.ggml.model": "bert"}
    write_gguf(path, "gemma2", config, state, Q.F32, metadata)
    with pytest.raises(FolioLoadError, match=r"bert\.gguf: its tokenizer cannot be converted "
                                             r"\(.*'bert'"):
        load_model_files(path)
