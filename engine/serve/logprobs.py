"""Log-probabilities in OpenAI's shapes, each token shown by its own text and bytes.

Chat completions: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}],
"refusal": null}``. Text completions (the legacy shape): ``{"tokens", "token_logprobs",
"top_logprobs": [{token: logprob}], "text_offset"}``, whose ``top_logprobs`` always hold
the chosen token too, as OpenAI's do ("up to logprobs + 1 elements"). Entries run one per
generated token, the stop token included (its text as the tokenizer writes it). A token
that is not whole UTF-8 by itself (half of an emoji) is written ``bytes:\\xf0\\x9f`` as
OpenAI writes it, so two such tokens never share a name; ``bytes`` holds the exact bytes.
"""

from __future__ import annotations

import codecs
import functools
import json
import re

from engine.outputs import TokenLogprobs

# JSON has no -inf; vLLM reports a token the model rules out at this floor.
LOGPROB_FLOOR = -9999.0
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.cache
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the printable character standing for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


class TokenTexts:
    """``texts(token_id) -> (text, UTF-8 bytes)``, memoised. Byte-level BPE tokens (Llama 3,
    Qwen, SmolLM) map back to their exact bytes, so a token holding half a character keeps
    them; sentencepiece byte-fallback tokens (``<0xE2>``) give their byte; other pieces
    their text, ``▁`` read as a space."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer  # a ChatTokenizer; its tokenizer is read on first use
        self._known: dict[int, tuple[str, list[int]]] = {}

    @functools.cached_property
    def _decoders(self) -> tuple[object, dict[int, str], bool]:
        hf = self._tokenizer.hf
        added = {i: t.content for i, t in getattr(hf, "added_tokens_decoder", {}).items()}
        decoder = json.dumps(json.loads(hf.backend_tokenizer.to_str()).get("decoder"))
        return hf, added, '"ByteLevel"' in decoder

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        known = self._known.get(token_id)
        if known is None:
            known = self._known[token_id] = self._text(token_id)
        return known

    def _text(self, token_id: int) -> tuple[str, list[int]]:
        hf, added, byte_level = self._decoders
        if token_id in added:
            raw = added[token_id].encode()
        else:
            piece = hf.convert_ids_to_tokens(token_id) or ""
            alphabet = _byte_level_alphabet()
            fallback = _BYTE_FALLBACK.match(piece)
            if byte_level and all(ch in alphabet for ch in piece):
                raw = bytes(alphabet[ch] for ch in piece)
            elif fallback:
                raw = bytes([int(fallback.group(1), 16)])
            else:
                raw = piece.replace("\u2581", " ").encode()
        try:
            return raw.decode("utf-8"), list(raw)
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), list(raw)


def _utf8() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


def _floor(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


class LogprobsFormat:
    """A choice's or chunk's ``logprobs`` object for one request. Text completions'
    ``text_offset`` (where each token starts in the reply, in characters; a token that
    ends half a character starts where that character will) runs on across a candidate's
    chunks."""

    def __init__(self, kind: str, texts: TokenTexts) -> None:
        self.kind, self.texts = kind, texts
        self._offsets: dict[int, tuple[int, codecs.IncrementalDecoder]] = {}

    def __call__(self, index: int, entries: list[TokenLogprobs] | None) -> dict | None:
        if entries is None:
            return None
        if self.kind == "chat":
            return {"content": [self._chat_entry(e) for e in entries], "refusal": None}
        return self._text_entries(index, entries)

    def _chat_entry(self, entry: TokenLogprobs) -> dict:
        text, raw = self.texts(entry.token_id)
        top = []
        for token_id, logprob in entry.top:
            alt_text, alt_raw = self.texts(token_id)
            top.append({"token": alt_text, "logprob": _floor(logprob), "bytes": alt_raw})
        return {"token": text, "logprob": _floor(entry.logprob), "bytes": raw,
                "top_logprobs": top}

    def _text_entries(self, index: int, entries: list[TokenLogprobs]) -> dict:
        offset, decoder = self._offsets.get(index) or (0, _utf8())
        tokens, logprobs, tops, offsets = [], [], [], []
        for entry in entries:
            text, raw = self.texts(entry.token_id)
            top = {self.texts(t)[0]: _floor(lp) for t, lp in entry.top}
            top[text] = _floor(entry.logprob)
            tokens.append(text)
            logprobs.append(_floor(entry.logprob))
            tops.append(top)
            offsets.append(offset)
            offset += len(decoder.decode(bytes(raw)))
        self._offsets[index] = offset, decoder
        return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops,
                "text_offset": offsets}
