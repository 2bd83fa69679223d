"""branch_tokens, what the context gauge counts for a chat: the open branch's last reply
with a usable count, whatever its row holds."""

from __future__ import annotations

import pytest

from desktop_app.controllers.context_window import branch_tokens
from desktop_app.data.chat_store import ChatStore
from tests.desktop_app.data.test_metric_values import BAD_VALUES, bad_metrics


@pytest.fixture
def store(tmp_path):
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def _chat(store, last_metrics, token_ids=None):
    """user, a reply counted 100 + 3, user, a reply with last_metrics."""
    chat = store.create_chat("c")
    u1 = store.add_message(chat.id, None, "user", "a")
    r1 = store.add_message(chat.id, u1.id, "assistant", "b", token_ids=[1, 2, 3],
                           metrics={"num_prompt_tokens": 100})
    u2 = store.add_message(chat.id, r1.id, "user", "c")
    # json.dumps writes NaN and Infinity, as rows from before imports were checked hold.
    store.add_message(chat.id, u2.id, "assistant", "d", token_ids=token_ids,
                      metrics=last_metrics)
    return chat.id


def test_counts_of_the_last_reply_and_fallbacks(store):
    assert branch_tokens(store, _chat(store, {"num_prompt_tokens": 200}, [7, 8])) == 202
    assert branch_tokens(store, _chat(store, {"num_prompt_tokens": 200,
                                              "num_generated_tokens": 5})) == 205
    assert branch_tokens(store, _chat(store, {"num_prompt_tokens": 200,
                                              "num_generated_tokens": "x"})) == 200
    assert branch_tokens(store, None) == 0


@pytest.mark.parametrize("value", BAD_VALUES, ids=ascii)
def test_a_reply_without_a_usable_count_is_passed_over(store, value):
    # The reply before it (100 prompt + 3 generated) is what the context is known to hold.
    assert branch_tokens(store, _chat(store, {"num_prompt_tokens": value})) == 103


def test_any_stored_metrics_give_a_count(store):
    for metrics in bad_metrics():  # the ones that are no object too, stored as they are
        tokens = branch_tokens(store, _chat(store, metrics))
        assert isinstance(tokens, int) and 0 <= tokens <= 2**32, metrics
