"""Grammars and token_masks on the tiny byte-level tokenizer: what a mask allows."""

from __future__ import annotations

import pytest
import torch

from engine import ResponseFormat
from engine.grammar import GrammarError, Grammars, token_masks
from tests.engine.tiny_models import byte_level_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return byte_level_tokenizer()


@pytest.fixture(scope="module")
def grammars(tokenizer):
    # Two logits columns past the tokenizer: a model's padded vocabulary.
    return Grammars(tokenizer, len(tokenizer) + 2, [tokenizer.eos_token_id])


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def accepts(grammars, tokenizer, fmt, text: str) -> bool:
    matcher = grammars.matcher(fmt)
    return all(matcher.accept(t) for t in ids(tokenizer, text))


def test_masks_allow_the_grammar_s_next_tokens_and_leave_free_rows_alone(grammars,
                                                                           tokenizer) -> None:
    matcher = grammars.matcher(ResponseFormat("json_schema", {"enum": ["ab", "cd"]}))
    masks = token_masks([None, matcher], grammars.vocab_size)
    assert masks[0] is None
    quote = ids(tokenizer, '"')[0]
    assert masks[1].shape == (grammars.vocab_size,) and masks[1].dtype == torch.bool
    assert torch.nonzero(masks[1]).flatten().tolist() == [quote]
    for t in ids(tokenizer, '"cd"'):
        assert matcher.accept(t)
    [mask] = token_masks([matcher], grammars.vocab_size)
    assert torch.nonzero(mask).flatten().tolist() == [tokenizer.eos_token_id]
    assert not mask[-2:].any()  # padded columns are never allowed
    assert matcher.accept(tokenizer.eos_token_id) and matcher.done


def test_a_forked_matcher_moves_on_its_own(grammars, tokenizer) -> None:
    parent = grammars.matcher(ResponseFormat("json_schema", {"enum": ["ab", "cd"]}))
    child = parent.fork()
    assert parent.accept(ids(tokenizer, '"')[0]) and parent.accept(ids(tokenizer, "a")[0])
    assert not child.accept(ids(tokenizer, "a")[0])  # the child still waits for its quote


def test_strings_hold_no_raw_control_characters(grammars, tokenizer) -> None:
    bounded = ResponseFormat("json_schema", {"type": "string", "maxLength": 4})
    assert accepts(grammars, tokenizer, bounded, '"ab é"')
    assert not accepts(grammars, tokenizer, bounded, '"a\x0b')
    assert not accepts(grammars, tokenizer, ResponseFormat("json_schema", {"type": "string"}),
                       '"a\x01')


def test_json_object_takes_any_object_and_nothing_else(grammars, tokenizer) -> None:
    fmt = ResponseFormat("json_object")
    assert accepts(grammars, tokenizer, fmt, '{"a": [1, {"b": null}], "c": "d"}')
    assert not accepts(grammars, tokenizer, fmt, "[1]")


def test_xgrammar_s_own_refusals_come_back_as_grammar_errors(grammars) -> None:
    schema = {"type": "object", "minProperties": 2, "additionalProperties": False}
    with pytest.raises(GrammarError, match="minProperties"):
        grammars.compile(ResponseFormat("json_schema", schema))
