"""One request in flight, as the app keeps it: the replies it writes (one per candidate),
their text and thinking so far, and how the request was asked.

The engine reads every reply: a delta arrives as typed parts (answer text, thinking) and
the finished candidate carries its answer, thinking and tool calls; nothing here parses a
reply. Partial text is saved a few times a second, so a crash loses little.

A continued reply (``Stream.continuing``) starts from the reply's text and ids: its
deltas are appended to them, the engine's finished message is the whole reply, and its
ids are the old ones then the new. Until it finishes the stored reply is left as it was,
so a failure or a crash loses nothing of it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from desktop_app.data.metric_values import count, measure
from engine.outputs import PromptProgress, ReplyMessage, TextDelta, Thinking

SAVE_INTERVAL_S = 0.25


@dataclass(slots=True)
class Stream:
    request_id: str
    chat_id: int
    parent_id: int
    message_ids: list[int]
    texts: list[str]
    thinking: list[str]  # a reasoning model's, per reply
    prompt_tokens: int = 0  # as measured when it was sent (the gauge, while streaming)
    reply_metrics: dict | None = None  # what the replies record of how they were asked
    last_saved: float = 0.0
    sent_at: float = 0.0  # time.monotonic() when it was sent: the reading line's clock
    # The prompt's reading until the first token (answering): the engine's last
    # PromptProgress, None before its first chunk or from a model that sends none.
    reading: PromptProgress | None = None
    answering: bool = False
    # A continued reply: its ids and metrics before (None: a new reply).
    before: tuple[list[int], dict] | None = None
    # A beam search's width (0: sampling): no token comes before its replies, whole.
    beam_width: int = 0

    @classmethod
    def started(cls, request_id: str, chat_id: int, parent_id: int, message_ids: list[int],
                prompt_tokens: int, reply_metrics: dict, beam_width: int = 0) -> Stream:
        n, now = len(message_ids), time.monotonic()
        return cls(request_id, chat_id, parent_id, message_ids, [""] * n, [""] * n,
                   prompt_tokens, reply_metrics, now, now, beam_width=beam_width)

    @classmethod
    def continuing(cls, request_id: str, message, prompt_tokens: int,
                   reply_metrics: dict, beam_width: int = 0) -> Stream:
        """``message``: the stored reply (chat_store.Message) the request continues."""
        now = time.monotonic()
        return cls(request_id, message.chat_id, message.parent_id, [message.id],
                   [message.content], [message.thinking], prompt_tokens, reply_metrics,
                   last_saved=now, sent_at=now,
                   before=(list(message.token_ids or []), dict(message.metrics)),
                   beam_width=beam_width)

    def live(self) -> dict[int, tuple[str, str]]:
        """Each reply's (text, thinking) so far, by message id: fresher than the store."""
        return {mid: (text, thought) for mid, text, thought in
                zip(self.message_ids, self.texts, self.thinking, strict=True)}

    def add(self, index: int, parts: tuple) -> tuple[str, str] | None:
        """A delta of reply ``index``: its (thinking, answer text); None for an index the
        request does not have. A call's parts are not kept: it comes whole with the reply."""
        if not 0 <= index < len(self.texts):
            return None
        thought = "".join(p.text for p in parts if isinstance(p, Thinking))
        text = "".join(p.text for p in parts if isinstance(p, TextDelta))
        self.thinking[index] += thought
        self.texts[index] += text
        return thought, text

    def save_partial(self, store) -> None:
        if self.before is not None:
            return  # the stored reply stays whole until the continuation finishes
        now = time.monotonic()
        if now - self.last_saved >= SAVE_INTERVAL_S:
            self.last_saved = now
            for mid, (text, thought) in self.live().items():
                store.set_partial(mid, text, thought)

    def finish(self, store, output) -> None:
        """Store each reply as the engine read it (a candidate missing from ``output`` as
        stopped, with what had streamed)."""
        base = asdict(output.metrics) if output.metrics is not None else {}
        by_index = {c.index: c for c in output.outputs}
        for i, mid in enumerate(self.message_ids):
            done = by_index.get(i)
            reply = (done.reply or ReplyMessage(done.text)) if done is not None else \
                ReplyMessage(self.texts[i])
            # A remote server sends text only: no ids, so the next turn re-tokenizes it.
            token_ids = list(done.token_ids) if done is not None and done.token_ids else None
            reason = done.finish_reason if done is not None else "abort"
            calls = [{"id": c.id, "name": c.name, "arguments": c.arguments}
                     for c in reply.calls] or None
            think_metrics = ({"thinking_tokens": reply.thinking_tokens,
                              "thinking_s": reply.thinking_s}
                             if reply.thinking_tokens else {})
            if self.before is not None:
                token_ids, think_metrics = self._joined(token_ids, think_metrics)
            thinking = reply.reasoning if reply.reasoning is not None else self.thinking[i]
            # A beam search counts every beam's tokens together: each beam keeps its own.
            own = {"num_generated_tokens": len(done.token_ids)} \
                if self.beam_width and done is not None else {}
            store.finish_message(mid, reply.content, token_ids,
                                 {**base, **own, "finish_reason": reason,
                                  **(self.reply_metrics or {}), **think_metrics},
                                 tool_calls=calls, thinking=thinking)

    def _joined(self, token_ids: list[int] | None, think: dict) -> tuple[list[int], dict]:
        """A continued reply's ids (the old then the new) and its thinking figures (both
        parts'); ``continued_tokens`` in its metrics says how many ids it had before."""
        ids, metrics = self.before
        old_thought = count(metrics, "thinking_tokens") or 0
        if old_thought:
            think = {"thinking_tokens": old_thought + (think.get("thinking_tokens") or 0),
                     "thinking_s": round((measure(metrics, "thinking_s") or 0)
                                         + (think.get("thinking_s") or 0), 3)}
        return [*ids, *(token_ids or [])], {**think, "continued_tokens": len(ids)}

    def fail(self, store, message: str) -> bool:
        """Keep what streamed as interrupted replies, drop the empty ones; returns whether
        anything was kept (a continued reply is kept as it was stored)."""
        if self.before is not None:
            return True
        for mid, (text, thought) in self.live().items():
            if text or thought:
                store.finish_message(mid, text, None, {"error": message}, "interrupted",
                                     thinking=thought)
            else:
                store.delete_message(mid)
        return any(self.texts) or any(self.thinking)
