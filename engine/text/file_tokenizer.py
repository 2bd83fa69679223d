"""Folio's own tokenizer object: a `tokenizers` tokenizer with a model file's named special
tokens, BOS / EOS flags and chat template, for the files whose tokenizer Folio builds
itself (GGUF files: engine/loaders/gguf/tokenizer.py), and for a tokenizer transformers
loaded that it answers for as well (``from_transformers``: a folder's, a GGUF file's
that transformers converted), kept so that later loads need no transformers.

It answers the part of transformers' tokenizer interface the engine calls (encode,
decode, the vocabulary, the special tokens, ``apply_chat_template``) with transformers
5's tokenizers-backed class's results, and builds exactly that class's backend: the
named special tokens the vocabulary lacks added as it adds them, the BOS / EOS
post-processor written as it writes it (tests/engine/text/test_file_tokenizer.py
compares the two backends' serializations). What it leaves out is importing
transformers, which costs a fresh process about a third of a second (transformers'
package scans every model's sources as it starts); its templates render through
engine/text/template_render.py. The few users of transformers' own object
(xgrammar's vocabulary table) get one built from this on demand (``as_transformers``).

Saved as ``tokenizer.json`` (the backend, whole) and ``folio_tokenizer.json`` (the rest),
read back without rebuilding anything (the GGUF conversion cache, the folder cache).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.text.template_render import render_chat, select_template

# transformers' named special tokens, in its order (``all_special_tokens`` lists them so).
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                 "cls_token", "mask_token")
CONFIG_FILE = "folio_tokenizer.json"
_FORMAT = 1
# What the engine calls of transformers' tokenizer: a class overriding any of these may
# answer otherwise than this object (``from_transformers``).
_CALLED = ("encode", "decode", "_decode", "_encode_plus", "__call__", "tokenize",
           "convert_ids_to_tokens", "convert_tokens_to_ids", "_convert_token_to_id_with_added_voc",
           "apply_chat_template", "get_chat_template", "get_vocab", "get_added_vocab",
           "added_tokens_decoder", "__len__", "vocab_size", "special_tokens_map",
           "all_special_tokens", "all_special_ids")


class FileTokenizer:
    """``backend``: a tokenizers.Tokenizer (taken over, not copied); ``special_tokens``:
    named special tokens (names from ``SPECIAL_NAMES``) to their text; ``add_bos_token``
    / ``add_eos_token``: whether encoding with special tokens puts them around the text
    (None: as the backend's post-processor has it, or neither when it has none)."""

    def __init__(self, backend: Any, special_tokens: Mapping[str, str | None],
                 add_bos_token: bool | None = None, add_eos_token: bool | None = None,
                 chat_template: str | dict[str, str] | None = None) -> None:
        unknown = set(special_tokens) - set(SPECIAL_NAMES)
        if unknown:
            raise ValueError(f"special_tokens: {sorted(unknown)} are not among "
                             f"{SPECIAL_NAMES}")
        self._take(backend, special_tokens, chat_template, (add_bos_token, add_eos_token))
        self._add_missing_specials()
        if add_bos_token is not None or add_eos_token is not None \
                or backend.post_processor is None:
            self._write_post_processor(bool(add_bos_token), bool(add_eos_token))

    @classmethod
    def from_transformers(cls, tokenizer: Any) -> FileTokenizer | None:
        """The same tokenizer as Folio's object (its backend copied, its named special
        tokens, flags and template), or None where transformers' object does something
        this one would not: a class that overrides what the engine calls, special tokens
        split as text, spaces cleaned up after decoding, special tokens beyond the named
        ones."""
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        if not isinstance(tokenizer, TokenizersBackend) or any(
                getattr(type(tokenizer), name) is not getattr(TokenizersBackend, name)
                for name in _CALLED):
            return None
        named = tokenizer.special_tokens_map
        cleans_up = tokenizer.clean_up_tokenization_spaces and (
            type(tokenizer.backend_tokenizer.model).__name__ != "BPE"
            or tokenizer.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output)
        if (tokenizer.split_special_tokens or cleans_up or not set(named) <= set(SPECIAL_NAMES)
                or tokenizer.all_special_tokens != list(dict.fromkeys(named.values()))):
            return None
        from tokenizers import Tokenizer

        made = cls.__new__(cls)
        made._take(Tokenizer.from_str(tokenizer.backend_tokenizer.to_str()), named,
                   tokenizer.chat_template, (tokenizer.add_bos_token, tokenizer.add_eos_token))
        return made

    @classmethod
    def from_folder(cls, folder: Path) -> FileTokenizer:
        """The tokenizer ``save_pretrained`` wrote to ``folder``, as it was (nothing re-added)."""
        from tokenizers import Tokenizer

        config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
        if not isinstance(config, dict) or config.get("format") != _FORMAT:
            raise ValueError(f"{folder / CONFIG_FILE}: not a tokenizer this Folio wrote")
        made = cls.__new__(cls)
        made._take(Tokenizer.from_file(str(folder / "tokenizer.json")),
                   config["special_tokens"], config["chat_template"],
                   tuple(config["add_special"]))
        return made

    def save_pretrained(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._backend.save(str(folder / "tokenizer.json"))
        config = {"format": _FORMAT, "special_tokens": self._special,
                  "add_special": list(self._flags), "chat_template": self.chat_template}
        (folder / CONFIG_FILE).write_text(json.dumps(config), encoding="utf-8")

    # -- the vocabulary -------------------------------------------------------------

    @property
    def backend_tokenizer(self) -> Any:
        return self._backend

    @property
    def vocab_size(self) -> int:
        """The base vocabulary, without the added tokens (``len`` counts them)."""
        return self._backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._backend.get_vocab(with_added_tokens=True)

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return self._backend.get_added_tokens_decoder()

    def get_added_vocab(self) -> dict[str, int]:
        return {token.content: index
                for index, token in sorted(self.added_tokens_decoder.items())}

    def convert_ids_to_tokens(self, ids: int | Sequence[int],
                              skip_special_tokens: bool = False) -> str | None | list:
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)
        skipped = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._backend.id_to_token(int(i)) for i in ids if int(i) not in skipped]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | None | list:
        if isinstance(tokens, str):
            return self._token_id(tokens)
        return [self._token_id(token) for token in tokens]

    # -- the special tokens ---------------------------------------------------------

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return {name: token for name, token in self._special.items() if token is not None}

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys(self.special_tokens_map.values()))

    @property
    def all_special_ids(self) -> list[int | None]:
        return [self._token_id(token) for token in self.all_special_tokens]

    bos_token = property(lambda self: self._special["bos_token"])
    eos_token = property(lambda self: self._special["eos_token"])
    unk_token = property(lambda self: self._special["unk_token"])
    pad_token = property(lambda self: self._special["pad_token"])
    bos_token_id = property(lambda self: self._named_id("bos_token"))
    eos_token_id = property(lambda self: self._named_id("eos_token"))
    unk_token_id = property(lambda self: self._named_id("unk_token"))
    pad_token_id = property(lambda self: self._named_id("pad_token"))

    # -- text -----------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text: a string to encode, got {type(text).__name__}")
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str | Sequence[str], add_special_tokens: bool = True,
                 truncation: bool = False, max_length: int | None = None) -> dict:
        """``{"input_ids": ...}`` for a text or a list of them, as transformers' call gives
        it; ``truncation`` cuts the text's ids so that with the special tokens around
        them there are at most ``max_length`` (the end-of-text an embedding model pools
        stays)."""
        texts = [text] if isinstance(text, str) else list(text)
        ids = [self._encode_cut(t, add_special_tokens, max_length if truncation else None)
               for t in texts]
        return {"input_ids": ids[0] if isinstance(text, str) else ids}

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[str]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).tokens

    def decode(self, ids: int | Sequence[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str:
        """``clean_up_tokenization_spaces``: accepted for transformers' signature; this
        object never cleans up (it stands only for tokenizers that do not:
        ``from_transformers``)."""
        ids = [ids] if isinstance(ids, int) else [int(i) for i in ids]
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, conversation: Sequence[Mapping[str, Any]],
                            tools: Sequence[dict] | None = None,
                            documents: Sequence[dict] | None = None,
                            chat_template: str | None = None,
                            add_generation_prompt: bool = False, tokenize: bool = True,
                            **variables: Any) -> str | list[int]:
        """The chat as the template writes it (its ids with ``tokenize``), with the named
        special tokens as variables under ``variables``."""
        template = select_template(self.chat_template if chat_template is None
                                   else chat_template, tools)
        text = render_chat(template, conversation, add_generation_prompt=add_generation_prompt,
                           tools=tools, documents=documents,
                           **{**self.special_tokens_map, **variables})
        return self.encode(text, add_special_tokens=False) if tokenize else text

    # -- building it as transformers does -----------------------------------------

    def _take(self, backend: Any, special_tokens: Mapping[str, str | None],
              chat_template: str | dict[str, str] | None,
              flags: tuple[bool | None, bool | None]) -> None:
        """Hold ``backend`` as transformers' encode leaves it (no truncation, no padding,
        special tokens matched whole) with these settings: every constructor's part."""
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = False
        self._backend = backend
        self._special = {name: special_tokens.get(name) for name in SPECIAL_NAMES}
        self.chat_template = chat_template
        self._flags = flags

    def _token_id(self, token: str) -> int | None:
        """The token's id; one outside the vocabulary is the unknown token (if any)."""
        found = self._backend.token_to_id(token)
        if found is None and self.unk_token is not None:
            return self._backend.token_to_id(self.unk_token)
        return found

    def _encode_cut(self, text: str, add_special_tokens: bool,
                    max_length: int | None) -> list[int]:
        if max_length is None:
            return self.encode(text, add_special_tokens)
        added = self._backend.num_special_tokens_to_add(False) if add_special_tokens else 0
        if max_length <= added:
            raise ValueError(f"max_length: {max_length} leaves no room beside the "
                             f"{added} special tokens")
        encoding = self._backend.encode(text, add_special_tokens=False)
        encoding.truncate(max_length - added)
        if add_special_tokens:
            encoding = self._backend.post_process(encoding)
        return encoding.ids

    def _named_id(self, name: str) -> int | None:
        token = self._special[name]
        return None if token is None else self._token_id(token)

    def _add_missing_specials(self) -> None:
        """A named special token that is not an added token becomes one (transformers adds
        it so, and then matches it whole in text)."""
        from tokenizers import AddedToken

        added = {token.content for token in self.added_tokens_decoder.values()}
        missing = [AddedToken(token, special=True)
                   for token in dict.fromkeys(self._special.values())
                   if token is not None and token not in added]
        if missing:
            self._backend.add_tokens(missing)

    def _write_post_processor(self, add_bos: bool, add_eos: bool) -> None:
        from tokenizers import processors

        bos, eos = self.bos_token, self.eos_token
        add_bos, add_eos = add_bos and bos is not None, add_eos and eos is not None
        self._flags = (add_bos, add_eos)
        single = (f"{bos}:0 " if add_bos else "") + "$A:0" + (f" {eos}:0" if add_eos else "")
        pair = (single + (f" {bos}:1" if add_bos else "") + " $B:1"
                + (f" {eos}:1" if add_eos else ""))
        specials = ([(bos, self.bos_token_id)] if add_bos else []) \
            + ([(eos, self.eos_token_id)] if add_eos else [])
        self._backend.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=specials)


def as_transformers(tokenizer: Any) -> Any:
    """``tokenizer`` as transformers' tokenizers-backed class (itself when it is one):
    for libraries that take only that (xgrammar). Imports transformers."""
    if not isinstance(tokenizer, FileTokenizer):
        return tokenizer
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    flags = dict(zip(("add_bos_token", "add_eos_token"), tokenizer._flags, strict=True))
    return TokenizersBackend(tokenizer_object=tokenizer.backend_tokenizer,
                             chat_template=tokenizer.chat_template,
                             **tokenizer.special_tokens_map,
                             **{k: v for k, v in flags.items() if v is not None})
