"""Recent replies' exact token ids, so a client's history sent back hits the prefix cache.

A client sends an earlier reply back as text, and the text tokenizes canonically; what
the model generated often is not canonical (a reply constrained by a grammar writes
``"get"`` as two tokens where the tokenizer has one), so from that token on the history
would miss the cache. The server remembers each reply's ids by its text and splices them
back (``ChatTokenizer.encode_chat``'s ``token_ids``) when the same text comes back. The
same text always decodes from those ids, so the prompt means what the client sent.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from engine.outputs import RequestOutput

_KEPT = 256  # replies remembered, least recently used forgotten first


class ReplyTokens:
    def __init__(self, kept: int = _KEPT) -> None:
        self._kept = kept
        self._ids: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()  # remembered on the event loop, read in a thread

    def remember(self, output: RequestOutput) -> None:
        with self._lock:
            for candidate in output.outputs:
                if candidate.text and candidate.token_ids:
                    self._ids[candidate.text] = list(candidate.token_ids)
                    self._ids.move_to_end(candidate.text)
            while len(self._ids) > self._kept:
                self._ids.popitem(last=False)

    def attach(self, messages: list[dict]) -> list[dict]:
        """``messages`` with each assistant reply the server wrote carrying its ids."""
        out = []
        with self._lock:
            for message in messages:
                ids = self._ids.get(message.get("content") or "")
                if message["role"] == "assistant" and ids is not None:
                    message = {**message, "token_ids": ids}
                out.append(message)
        return out
