"""Hugging Face folders: tiny random Llamas saved with save_pretrained, and every error case."""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from engine.loaders import load_model_files
from engine.loaders.base import (
    FolioLoadError,
    WeightStream,
    check_weight_shapes,
    display_name,
)

VOCAB = {"<s>": 0, "</s>": 1, "h": 2, "e": 3, "l": 4, "o": 5, "he": 6, "ll": 7, "hell": 8,
         "hello": 9, "w": 10, "r": 11, "d": 12}
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o")]
TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"


def tiny_config(tied: bool = True, layers: int = 2) -> LlamaConfig:
    return LlamaConfig(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, tie_word_embeddings=tied)


def save_tiny_model(folder: Path, tied: bool = True, **save_kwargs) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(tied))
    model.save_pretrained(folder, **save_kwargs)
    backend = Tokenizer(models.BPE(vocab=VOCAB, merges=MERGES))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>",
                                        eos_token="</s>")
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    if tied:
        state.pop("lm_head.weight")
    return state


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    folder = tmp_path_factory.mktemp("models") / "tiny-llama"
    return folder, save_tiny_model(folder)


@pytest.fixture
def model_copy(saved, tmp_path) -> Path:
    """A copy the test may break."""
    return Path(shutil.copytree(saved[0], tmp_path / "tiny-llama"))


def test_single_file_loads_identical_tensors(saved):
    folder, state = saved
    assert (folder / "model.safetensors").is_file()
    model = load_model_files(folder)
    weights = dict(model.weights)
    assert set(weights) == set(state)
    for name, tensor in state.items():
        assert torch.equal(weights[name], tensor), name
    c = model.config
    assert (c.model_type, c.num_hidden_layers, c.hidden_size, c.num_key_value_heads) == (
        "llama", 2, 32, 2)
    assert c.tie_word_embeddings is True
    assert (model.format, model.name, model.source) == ("hf", "tiny-llama", folder)
    assert model.tokenizer.encode("hello world") == [9, 10, 5, 11, 4, 12]
    assert model.tokenizer.chat_template == TEMPLATE


def test_sharded_folder_loads_identical_tensors(tmp_path):
    folder = tmp_path / "sharded"
    state = save_tiny_model(folder, tied=False, max_shard_size="20KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    model = load_model_files(folder)
    weights = dict(model.weights)
    assert set(weights) == set(state) and "lm_head.weight" in weights
    for name, tensor in state.items():
        assert torch.equal(weights[name], tensor), name


def test_weights_are_cast_to_dtype_and_reiterable(saved):
    folder, state = saved
    events = []
    model = load_model_files(folder, dtype=torch.bfloat16,
                             progress=lambda stage, part: events.append((stage, part)))
    assert events == [("config", 0.0), ("config", 1.0), ("tokenizer", 0.0), ("tokenizer", 1.0),
                      ("index", 0.0), ("index", 1.0)]
    first = dict(model.weights)
    second = dict(model.weights)
    assert len(model.weights) == len(state)
    name = "model.layers.1.mlp.down_proj.weight"
    assert first[name].dtype == torch.bfloat16
    assert torch.equal(first[name], state[name].to(torch.bfloat16))
    assert torch.equal(first[name], second[name])
    weight_events = [e for e in events if e[0] == "weights"]
    assert weight_events[0] == ("weights", 0.0) and weight_events[-1] == ("weights", 1.0)


def test_weight_stream_reports_fractions():
    events = []
    stream = WeightStream({"a": (1,), "b": (2,)},
                          lambda: iter([("a", torch.zeros(1)), ("b", torch.zeros(2))]),
                          lambda stage, part: events.append((stage, part)))
    assert [name for name, _ in stream] == ["a", "b"]
    assert events == [("weights", 0.0), ("weights", 0.5), ("weights", 1.0)]


def test_dtype_must_be_floating(saved):
    with pytest.raises(ValueError, match="dtype must be a floating torch.dtype"):
        load_model_files(saved[0], dtype=torch.int8)


def test_missing_path(tmp_path):
    with pytest.raises(FolioLoadError, match=r"nowhere: no such file or folder"):
        load_model_files(tmp_path / "nowhere")


def test_a_file_that_is_not_a_model(saved):
    with pytest.raises(FolioLoadError, match=r"config\.json: not a model; pass its folder"):
        load_model_files(saved[0] / "config.json")


def test_missing_config(model_copy):
    (model_copy / "config.json").unlink()
    with pytest.raises(FolioLoadError, match=r"tiny-llama/config\.json: missing"):
        load_model_files(model_copy)


def test_unreadable_config(model_copy):
    (model_copy / "config.json").write_text("{ broken")
    with pytest.raises(FolioLoadError, match=r"config\.json: cannot be read as a model config"):
        load_model_files(model_copy)


def test_missing_tokenizer(model_copy):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model_copy / name).unlink()
    with pytest.raises(FolioLoadError, match=r"tiny-llama: no usable tokenizer"):
        load_model_files(model_copy)


def test_missing_weights(model_copy):
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(FolioLoadError, match=r"tiny-llama: no weights"):
        load_model_files(model_copy)


def test_bin_only_folder_is_rejected(model_copy):
    (model_copy / "model.safetensors").unlink()
    (model_copy / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(FolioLoadError, match=r"tiny-llama: only PyTorch \.bin/\.pth weights"):
        load_model_files(model_copy)


def test_truncated_safetensors(model_copy):
    weights = model_copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-100])
    with pytest.raises(FolioLoadError, match=r"model\.safetensors: truncated .*download it again"):
        load_model_files(model_copy)


def test_garbage_safetensors(model_copy):
    (model_copy / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(FolioLoadError, match=r"model\.safetensors: not a valid safetensors file"):
        load_model_files(model_copy)


def test_shard_listed_in_index_is_missing(tmp_path):
    folder = tmp_path / "sharded"
    save_tiny_model(folder, max_shard_size="20KB")
    shard = sorted(folder.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(FolioLoadError, match=rf"{shard.name}: missing, but "
                                             r"model\.safetensors\.index\.json lists it"):
        load_model_files(folder)


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def test_shape_mismatch_names_tensor_and_shapes(model_copy):
    edit_config(model_copy, intermediate_size=48)
    with pytest.raises(FolioLoadError) as err:
        load_model_files(model_copy)
    assert str(err.value) == (
        f"{model_copy / 'model.safetensors'}: tensor model.layers.0.mlp.down_proj.weight has "
        "shape [32, 64], but the config implies [32, 48]; the weights do not belong to this "
        "config")


def test_weights_with_more_layers_than_config(model_copy):
    edit_config(model_copy, num_hidden_layers=1)
    with pytest.raises(FolioLoadError, match=r"tensor model\.layers\.1\.\S+ is beyond the "
                                             r"config's 1 layers"):
        load_model_files(model_copy)


def test_weights_with_fewer_layers_than_config(model_copy):
    edit_config(model_copy, num_hidden_layers=3)
    with pytest.raises(FolioLoadError, match=r"tiny-llama: 9 weights the config needs are "
                                             r"missing \(first: model\.layers\.2\."):
        load_model_files(model_copy)


def test_untied_config_needs_lm_head(model_copy):
    edit_config(model_copy, tie_word_embeddings=False)
    with pytest.raises(FolioLoadError, match=r"1 weights the config needs are missing "
                                             r"\(first: lm_head\.weight\)"):
        load_model_files(model_copy)


def test_shape_check_covers_qwen2_biases_and_skips_other_families():
    config = types.SimpleNamespace(
        model_type="qwen2", hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
        head_dim=None, intermediate_size=16, vocab_size=10, num_hidden_layers=1,
        tie_word_embeddings=True, rms_norm_eps=1e-6, max_position_embeddings=64)
    shapes = {"model.embed_tokens.weight": (10, 8), "model.norm.weight": (8,),
              "model.layers.0.self_attn.q_proj.weight": (8, 8),
              "model.layers.0.self_attn.k_proj.weight": (4, 8),
              "model.layers.0.self_attn.v_proj.weight": (4, 8),
              "model.layers.0.self_attn.o_proj.weight": (8, 8),
              "model.layers.0.mlp.gate_proj.weight": (16, 8),
              "model.layers.0.mlp.up_proj.weight": (16, 8),
              "model.layers.0.mlp.down_proj.weight": (8, 16),
              "model.layers.0.input_layernorm.weight": (8,),
              "model.layers.0.post_attention_layernorm.weight": (8,)}
    with pytest.raises(FolioLoadError, match=r"m: 3 weights .* missing \(first: "
                                             r"model\.layers\.0\.self_attn\.q_proj\.bias"):
        check_weight_shapes(config, shapes, lambda name: "f", "m")
    biases = {"model.layers.0.self_attn.q_proj.bias": (8,),
              "model.layers.0.self_attn.k_proj.bias": (4,),
              "model.layers.0.self_attn.v_proj.bias": (4,)}
    check_weight_shapes(config, shapes | biases, lambda name: "f", "m")
    with pytest.raises(FolioLoadError, match=r"f: tensor model\.layers\.0\.self_attn\.k_proj\."
                                             r"bias has shape \[8\], but the config implies \[4\]"):
        check_weight_shapes(config, shapes | biases | {
            "model.layers.0.self_attn.k_proj.bias": (8,)}, lambda name: "f", "m")
    config.model_type = "gpt2"  # left to the model registry
    check_weight_shapes(config, {"model.norm.weight": (3,)}, lambda name: "f", "m")


def test_display_name_of_a_hugging_face_cache_snapshot(tmp_path):
    snapshot = tmp_path / "models--HuggingFaceTB--SmolLM2-135M" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    assert display_name(snapshot) == "HuggingFaceTB/SmolLM2-135M"
    (snapshot / "sub").mkdir()
    (snapshot / "sub" / "m.Q4_1.gguf").write_bytes(b"GGUF")
    assert display_name(snapshot / "sub" / "m.Q4_1.gguf") == (
        "HuggingFaceTB/SmolLM2-135M/sub/m.Q4_1.gguf")
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    assert display_name(tmp_path / "x.gguf") == "x"
    plain = tmp_path / "my-model"
    plain.mkdir()
    assert display_name(plain) == "my-model"
