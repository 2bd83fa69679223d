"""A model file without a chat template gets its family's turn format: a tiny GGUF of each
family written without ``tokenizer.chat_template`` (its vocabulary holding the format's
special tokens) renders a two-turn chat in that family's format, with the format's end of
turn as a stop token; the file's own template and a user's choice come first; a template
that cannot render a two-turn chat is refused with its error."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch
import transformers
from gguf.constants import MODEL_ARCH

from engine import LLM, SamplingParams
from engine.loaders import load_model_files
from engine.models import family_of
from engine.text.chat_template import chat_tokenizer_for
from engine.text.turn_formats import (
    CHATML,
    FORMATS,
    FROM_FAMILY,
    FROM_FILE,
    FROM_USER,
    TWO_TURNS,
    check_template,
    family_format,
)
from tests.engine.loaders.gguf.test_gguf_families import (  # noqa: F401 - cache_dir: autouse
    byte_level_metadata,
    cache_dir,
    put,
)
from tests.engine.loaders.gguf.test_gguf_gemma4 import gemma4_metadata
from tests.engine.tiny_models import (
    tiny_gemma4_config,
    tiny_gemma_config,
    tiny_llama_config,
    tiny_phi3_config,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

BYTES = 259  # the tiny vocabulary: 256 bytes and three specials


def _qwen2(vocab: int):
    return transformers.Qwen2Config(**{**tiny_llama_config(vocab_size=vocab).to_dict(),
                                       "architectures": None, "model_type": "qwen2"})


# file arch, gguf arch, the config, the format's special tokens, the chat it renders.
FAMILIES = {
    "gemma3": ("gemma3", MODEL_ARCH.GEMMA3, lambda v: tiny_gemma_config(3, vocab_size=v),
               ["<start_of_turn>", "<end_of_turn>"],
               "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi!"
               "<end_of_turn>\n<start_of_turn>user\nHow are you?<end_of_turn>\n"
               "<start_of_turn>model\n"),
    "gemma4": ("gemma4", MODEL_ARCH.GEMMA4, lambda v: tiny_gemma4_config(
        vocab_size=v, vocab_size_per_layer_input=v), ["<|turn>", "<turn|>"],
               "<|turn>user\nHello<turn|>\n<|turn>model\nHi!<turn|>\n<|turn>user\n"
               "How are you?<turn|>\n<|turn>model\n"),
    "llama3": ("llama", MODEL_ARCH.LLAMA, lambda v: tiny_llama_config(vocab_size=v),
               ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\nHi!<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    # A "llama" file whose vocabulary has Mistral's markers, not Llama 3's.
    "mistral": ("llama", MODEL_ARCH.LLAMA, lambda v: tiny_llama_config(vocab_size=v),
                ["[INST]", "[/INST]"],
                "[INST] Hello [/INST]Hi!<|im_end|>[INST] How are you? [/INST]"),
    "qwen2": ("qwen2", MODEL_ARCH.QWEN2, _qwen2, [],
              "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi!<|im_end|>\n"
              "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n"),
    "phi3": ("phi3", MODEL_ARCH.PHI3, lambda v: tiny_phi3_config(vocab_size=v),
             ["<|user|>", "<|assistant|>", "<|end|>"],
             "<|user|>\nHello<|end|>\n<|assistant|>\nHi!<|end|>\n<|user|>\nHow are you?"
             "<|end|>\n<|assistant|>\n"),
}
END_OF_TURN = {"gemma3": "<end_of_turn>", "gemma4": "<turn|>", "llama3": "<|eot_id|>",
               "qwen2": "<|im_end|>", "phi3": "<|end|>"}


def family_keys(arch: str, config) -> dict[str, object]:
    if arch == "gemma4":
        return gemma4_metadata(config)
    keys: dict[str, object] = {
        "context_length": config.max_position_embeddings,
        "block_count": config.num_hidden_layers, "embedding_length": config.hidden_size,
        "feed_forward_length": config.intermediate_size,
        "attention.head_count": config.num_attention_heads,
        "attention.head_count_kv": config.num_key_value_heads,
        "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
    }
    if arch == "gemma3":
        keys |= {"attention.key_length": config.head_dim,
                 "attention.sliding_window": config.sliding_window,
                 "attention.sliding_window_pattern": [
                     t == "sliding_attention" for t in config.layer_types]}
    return {f"{arch}.{name}": value for name, value in keys.items()}


def write_without_template(path: Path, family: str) -> Path:
    """A random tiny model of ``family`` as a GGUF with no tokenizer.chat_template."""
    arch, model_arch, make_config, specials, _ = FAMILIES[family]
    config = make_config(BYTES + len(specials))
    torch.manual_seed(0)
    state = transformers.AutoModelForCausalLM.from_config(config).state_dict()
    tokenizer = byte_level_metadata()
    del tokenizer["tokenizer.chat_template"]
    tokenizer["tokenizer.ggml.tokens"] = tokenizer["tokenizer.ggml.tokens"] + specials
    tokenizer["tokenizer.ggml.scores"] = [0.0] * (BYTES + len(specials))
    tokenizer["tokenizer.ggml.token_type"] = tokenizer["tokenizer.ggml.token_type"] + [3] * len(
        specials)
    name_map = gguf.get_tensor_name_map(model_arch, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in {**family_keys(arch, config), **tokenizer}.items():
        put(writer, key, value)
    for name, tensor in state.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        gguf_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if name.endswith("layer_scalar"):  # Gemma4Model.filter_tensors adds the suffix
            gguf_name += ".weight"
        writer.add_tensor(gguf_name, tensor.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_file_without_a_template_renders_its_familys_format(tmp_path, family):
    loaded = load_model_files(write_without_template(tmp_path / f"{family}.gguf", family))
    assert not loaded.tokenizer.chat_template
    tok = chat_tokenizer_for(loaded.tokenizer, family_of(loaded.config).turn_format)
    assert tok.template_source == FROM_FAMILY and tok.stop_strings == ()
    text = tok.decode(tok.encode_chat(list(TWO_TURNS)), skip_special_tokens=False)
    assert text.removeprefix("<|endoftext|>") == FAMILIES[family][4]
    if family in END_OF_TURN:
        assert tok.end_of_turn_token_id == loaded.tokenizer.convert_tokens_to_ids(
            END_OF_TURN[family])


def test_the_engine_chats_in_the_family_format_and_reuses_the_earlier_turn(tmp_path):
    llm = LLM(str(write_without_template(tmp_path / "gemma3.gguf", "gemma3")),
              num_gpu_blocks=32)
    assert llm.engine.tokenizer.template_source == FROM_FAMILY
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    messages = [{"role": "user", "content": "Hello there, how is the weather today?"}]
    first = llm.chat(messages, params)
    reply = first.outputs[0]
    messages += [{"role": "assistant", "content": reply.text, "token_ids": reply.token_ids},
                 {"role": "user", "content": "And tomorrow?"}]
    second = llm.chat(messages, params)
    assert second.prompt_token_ids[:len(first.prompt_token_ids)] == first.prompt_token_ids
    assert second.metrics.num_cached_tokens >= 16


def test_the_files_template_and_the_users_choice_come_first(tmp_path):
    loaded = load_model_files(write_without_template(tmp_path / "gemma3.gguf", "gemma3"))
    loaded.tokenizer.chat_template = CHATML
    tok = chat_tokenizer_for(loaded.tokenizer, "gemma")
    assert tok.template_source == FROM_FILE
    pasted = FORMATS["gemma"].template
    tok = chat_tokenizer_for(loaded.tokenizer, "gemma", pasted)
    assert tok.template_source == FROM_USER and loaded.tokenizer.chat_template == pasted


def test_a_vocabulary_without_the_familys_markers_falls_back_to_one_it_has():
    assert family_format("llama3", {"[INST]": 5}).name == "mistral"
    assert family_format("gemma", {"a": 1}).name == "chatml"
    assert family_format("gemma", None).name == "gemma"


@pytest.mark.parametrize(("template", "words"), [
    ("{% for m in messages %}{{ m.content }}", "two-turn chat.*endfor"),
    ("{{ raise_exception('System role not supported') }}", "System role not supported"),
    ("{{ messages[0].content }}", "leaves out 'Hi!'"),
    ("   ", "empty"),
])
def test_a_template_that_fails_to_render_is_refused_with_its_error(template, words):
    with pytest.raises(ValueError, match=f"chat_template: .*{words}"):
        check_template(template)


def test_the_engine_refuses_a_bad_template_naming_it(tmp_path):
    path = write_without_template(tmp_path / "qwen2.gguf", "qwen2")
    with pytest.raises(ValueError, match="chat_template: .*two-turn chat"):
        LLM(str(path), num_gpu_blocks=8, chat_template="{% if %}")
