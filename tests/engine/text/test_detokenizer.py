"""IncrementalDetokenizer: streamed text deltas, on the starter's real tokenizer and on tiny
hand-built ones."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine.text.detokenizer import IncrementalDetokenizer
from tests.engine.text.text_cases import IM_END, byte_tokenizer, user


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """Sentencepiece-style words: decoding drops the leading space of the first token."""
    vocab = {"▁Hello": 0, "▁world": 1, "<unk>": 2}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def stream(detokenizer: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detokenizer.add(t) for t in ids]


def test_half_an_emoji_is_held_back(starter) -> None:
    ids = starter.encode(" héllo 😀 world")
    assert starter.hf.convert_ids_to_tokens(ids) == ["Ġh", "Ã©", "llo", "ĠðŁĺ", "Ģ", "Ġworld"]
    detokenizer = IncrementalDetokenizer(starter)
    assert stream(detokenizer, ids + [IM_END]) == [" h", "é", "llo", "", " 😀", " world", ""]
    assert detokenizer.text == " héllo 😀 world"
    assert detokenizer.output_ids == ids + [IM_END]


def test_single_byte_tokens_wait_for_the_whole_character() -> None:
    hf = byte_tokenizer()
    ids = hf.encode("a😀é", add_special_tokens=False)
    assert len(ids) == 7
    assert stream(IncrementalDetokenizer(hf), ids) == ["a", "", "", "", "😀", "", "é"]


def test_flush_hands_over_a_trailing_half_character() -> None:
    hf = byte_tokenizer()
    ids = hf.encode("é😀", add_special_tokens=False)[:4]  # é and half the emoji
    detokenizer = IncrementalDetokenizer(hf)
    assert stream(detokenizer, ids) == ["", "é", "", ""]
    assert detokenizer.flush() == "\ufffd"
    assert detokenizer.text == hf.decode(ids) == "é\ufffd"
    assert detokenizer.flush() == ""


def test_leading_spaces_decode_in_context() -> None:
    hf = metaspace_tokenizer()
    assert [hf.decode([t]) for t in (0, 1)] == ["Hello", "world"]  # the naive way loses it
    assert stream(IncrementalDetokenizer(hf), [0, 1]) == ["Hello", " world"]
    # After a prompt, the first token's leading space is text too.
    assert stream(IncrementalDetokenizer(hf, prompt_ids=[1]), [0, 1]) == [" Hello", " world"]


def test_special_tokens_are_skipped_unless_asked(starter) -> None:
    ids = starter.encode("Hi") + [IM_END]
    assert "".join(stream(IncrementalDetokenizer(starter), ids)) == "Hi"
    kept = IncrementalDetokenizer(starter, skip_special_tokens=False)
    assert "".join(stream(kept, ids)) == "Hi<|im_end|>"


ALPHABET = "ab é😀🇫🇷👩‍👩‍👧中文\n\t.,'-0123"


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=ALPHABET, max_size=40), with_prompt=st.booleans())
def test_deltas_add_up_to_the_decoded_output(starter, text: str, with_prompt: bool) -> None:
    ids = starter.encode(text) + [IM_END]
    prompt = starter.encode_chat([user("Hi")]) if with_prompt else None
    deltas = stream(IncrementalDetokenizer(starter, prompt_ids=prompt), ids)
    assert "".join(deltas) == starter.decode(ids) == text
    assert not any(delta.endswith("\ufffd") for delta in deltas)


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, 49151), max_size=30))
def test_any_id_sequence_streams_to_its_decoding(starter, ids: list[int]) -> None:
    # Random ids include lone UTF-8 fragments and special tokens.
    detokenizer = IncrementalDetokenizer(starter)
    assert "".join(stream(detokenizer, ids)) + detokenizer.flush() == starter.decode(ids)
