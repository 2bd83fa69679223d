"""FileTokenizer against transformers' tokenizers-backed class built from the same backend
and settings (the object GGUF loads gave before): the same backend serialization, ids,
text, vocabulary, special tokens and rendered chats; saved and read back unchanged."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from engine.text.file_tokenizer import FileTokenizer, as_transformers
from tests.engine.tiny_models import CHATML
from tests.engine.tools.tool_models import HERMES_TEMPLATE, LLAMA3_TEMPLATE

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXTS = ["", "hello world", "<|im_start|>user\nhi<|im_end|>\n", "  spaced  out ",
         "é😀 unicode", "<|endoftext|><|im_end|>", "<unk> and <pad>", "tab\tnew\nline"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "tool_calls": None},
        {"role": "user", "content": "Again?"}]


def byte_level_core() -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab["he"] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[("h", "e")]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIALS)
    return core


def both(core: Tokenizer, **config):
    """Ours and transformers' class over copies of ``core`` with ``config``."""
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    special = {name: config.get(name) for name in names}
    flags = {k: config[k] for k in ("add_bos_token", "add_eos_token") if k in config}
    ours = FileTokenizer(Tokenizer.from_str(core.to_str()), special,
                         chat_template=config.get("chat_template"), **flags)
    theirs = TokenizersBackend(tokenizer_object=Tokenizer.from_str(core.to_str()),
                               **{k: v for k, v in config.items() if v is not None})
    return ours, theirs


def assert_same(ours, theirs) -> None:
    assert json.loads(ours.backend_tokenizer.to_str()) == json.loads(
        theirs.backend_tokenizer.to_str())
    assert (len(ours), ours.vocab_size) == (len(theirs), theirs.vocab_size)
    assert ours.get_vocab() == theirs.get_vocab()
    assert ours.get_added_vocab() == theirs.get_added_vocab()
    assert ours.special_tokens_map == theirs.special_tokens_map
    assert ours.all_special_tokens == theirs.all_special_tokens
    assert ours.all_special_ids == theirs.all_special_ids
    for name in ("bos", "eos", "unk", "pad"):
        assert getattr(ours, f"{name}_token") == getattr(theirs, f"{name}_token")
        assert getattr(ours, f"{name}_token_id") == getattr(theirs, f"{name}_token_id")
    assert ours.convert_tokens_to_ids(["he", "<|im_end|>", "nowhere"]) == \
        theirs.convert_tokens_to_ids(["he", "<|im_end|>", "nowhere"])
    for text in TEXTS:
        for special in (True, False):
            ids = theirs.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == ids, (text, special)
            assert ours.tokenize(text) == theirs.tokenize(text)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                    ids, skip_special_tokens=skip)
                assert ours.convert_ids_to_tokens(ids, skip_special_tokens=skip) == \
                    theirs.convert_ids_to_tokens(ids, skip_special_tokens=skip)
    if theirs.chat_template is not None:
        for generation in (True, False):
            for tokenize in (True, False):
                assert ours.apply_chat_template(
                    CHAT, add_generation_prompt=generation, tokenize=tokenize) == \
                    theirs.apply_chat_template(CHAT, add_generation_prompt=generation,
                                               tokenize=tokenize, return_dict=False)


CASES = {
    "no BOS flag, specials already added": dict(
        eos_token="<|im_end|>", unk_token="<|endoftext|>", chat_template=CHATML),
    "BOS and EOS added": dict(
        bos_token="<|im_start|>", eos_token="<|im_end|>", add_bos_token=True,
        add_eos_token=True, chat_template=HERMES_TEMPLATE),
    "BOS in the template": dict(bos_token="<|im_start|>", eos_token="<|im_end|>",
                                chat_template=LLAMA3_TEMPLATE),
    "BOS switched off": dict(bos_token="<|im_start|>", eos_token="<|im_end|>",
                             add_bos_token=False),
    # A named token that is a plain vocabulary entry becomes an added special token.
    "pad is a plain token": dict(eos_token="<|im_end|>", pad_token="he", add_bos_token=True,
                                 bos_token="<|endoftext|>"),
    # One outside the vocabulary is added past it, once however many names it has.
    "unknown token not in the vocabulary": dict(eos_token="<|im_end|>", unk_token="<unk>",
                                                pad_token="<unk>"),
    "BOS asked for with none named": dict(eos_token="<|im_end|>", add_bos_token=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_it_is_transformers_class_without_transformers(case):
    ours, theirs = both(byte_level_core(), **CASES[case])
    assert_same(ours, theirs)


def test_a_backend_with_its_own_post_processor_keeps_it_without_flags():
    core = byte_level_core()
    core.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", core.token_to_id(
            "<|im_start|>"))])
    ours, theirs = both(core, eos_token="<|im_end|>")
    assert_same(ours, theirs)
    assert ours.encode("he")[0] == core.token_to_id("<|im_start|>")


@pytest.mark.parametrize("case", ["BOS and EOS added", "no BOS flag, specials already added"])
def test_called_on_texts_it_cuts_them_as_transformers_does(case):
    ours, theirs = both(byte_level_core(), **CASES[case])
    texts = [t for t in TEXTS if t] + ["a much longer text than the others here " * 3]
    for max_length in (3, 8, 200):
        assert ours(texts, truncation=True, max_length=max_length)["input_ids"] == theirs(
            texts, truncation=True, max_length=max_length)["input_ids"]
    assert ours(TEXTS[1])["input_ids"] == theirs(TEXTS[1])["input_ids"]
    assert ours(TEXTS, add_special_tokens=False)["input_ids"] == theirs(
        TEXTS, add_special_tokens=False)["input_ids"]


def test_named_templates_pick_tool_use_with_tools_else_default():
    named = {"default": CHATML, "tool_use": HERMES_TEMPLATE}
    ours, theirs = both(byte_level_core(), eos_token="<|im_end|>", chat_template=named)
    tools = [{"type": "function", "function": {"name": "now", "parameters": {}}}]
    for given in (None, tools):
        assert ours.apply_chat_template(CHAT, tools=given, tokenize=False) == \
            theirs.apply_chat_template(CHAT, tools=given, tokenize=False)
    assert "<tools>" in ours.apply_chat_template(CHAT, tools=tools, tokenize=False)
    ours.chat_template = {"tool_use": HERMES_TEMPLATE}
    with pytest.raises(ValueError, match="chat_template: .*none is the default"):
        ours.apply_chat_template(CHAT, tokenize=False)


def test_saved_and_read_back_it_is_the_same_tokenizer(tmp_path):
    ours, theirs = both(byte_level_core(), **CASES["BOS and EOS added"])
    ours.save_pretrained(tmp_path / "saved")
    again = FileTokenizer.from_folder(tmp_path / "saved")
    assert again.chat_template == HERMES_TEMPLATE
    assert_same(again, theirs)
    assert as_transformers(again).add_bos_token is theirs.add_bos_token is True


def test_a_folder_it_did_not_write_is_refused(tmp_path):
    (tmp_path / "folio_tokenizer.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="not a tokenizer this Folio wrote"):
        FileTokenizer.from_folder(tmp_path)


def test_as_transformers_is_the_same_tokenizer_in_transformers_class():
    ours, theirs = both(byte_level_core(), **CASES["BOS and EOS added"])
    converted = as_transformers(ours)
    assert isinstance(converted, TokenizersBackend)
    assert_same(ours, converted)
    assert as_transformers(theirs) is theirs


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"special_tokens: \['image_token'\]"):
        FileTokenizer(byte_level_core(), {"image_token": "<img>"})
    ours, _ = both(byte_level_core(), eos_token="<|im_end|>")
    with pytest.raises(ValueError, match="text: a string"):
        ours.encode(["a list"])
    ours, _ = both(byte_level_core(), **CASES["BOS and EOS added"])
    with pytest.raises(ValueError, match="max_length: 2 leaves no room"):
        ours("hello", truncation=True, max_length=2)


def test_from_transformers_is_the_same_tokenizer():
    _, theirs = both(byte_level_core(), **CASES["BOS and EOS added"])
    own = FileTokenizer.from_transformers(theirs)
    assert_same(own, theirs)
    assert as_transformers(own).add_bos_token is True


class _OwnDecode(TokenizersBackend):
    def _decode(self, *args, **kwargs) -> str:
        return "decoded its own way"


def test_from_transformers_refuses_a_tokenizer_that_answers_otherwise():
    core = byte_level_core()
    base = dict(eos_token="<|im_end|>")
    refused = {
        "a class overriding decode": _OwnDecode(tokenizer_object=core, **base),
        "special tokens split as text": TokenizersBackend(
            tokenizer_object=core, split_special_tokens=True, **base),
        "special tokens beyond the named": TokenizersBackend(
            tokenizer_object=core, extra_special_tokens=["<|im_start|>"], **base),
    }
    words = Tokenizer(models.WordLevel({"a": 0, ".": 1, "[UNK]": 2}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    refused["spaces cleaned up after decoding"] = TokenizersBackend(
        tokenizer_object=words, clean_up_tokenization_spaces=True, unk_token="[UNK]")
    for why, tokenizer in refused.items():
        assert FileTokenizer.from_transformers(tokenizer) is None, why
    kept = TokenizersBackend(tokenizer_object=words, unk_token="[UNK]")
    assert FileTokenizer.from_transformers(kept).decode([0, 1]) == kept.decode([0, 1])
