"""A GGUF file's tokenizer built straight from its own keys (``tokenizer.ggml.*``) with the
`tokenizers` library: the first load of a file no longer has transformers convert it
(its GGUF path reads the whole file with gguf.GGUFReader, a Python object per vocabulary
entry and merge, and imports every family's tokenizer class).

Two kinds are built here, each to the very tokenizer transformers' conversion makes of the
same keys (tests/engine/loaders/gguf/test_gguf_tokenizer.py compares token ids, special
tokens and decoding):

- ``gpt2``: byte-level BPE with the file's merges (Llama 3, Qwen2, SmolLM): tokens spelled
  in GPT-2's byte alphabet, the pre-tokenizer's split regex the one ``tokenizer.ggml.pre``
  names (``_SPLITS``; GPT-2's own for ``default``, ``gpt2``, ``smollm``).
- ``llama``: SentencePiece-style BPE (Llama 2, Mistral, Phi-3): merges from the file or
  recovered from the tokens' scores, byte fallback, "▁" for a space (Phi-3's by a
  normalizer that puts one before the text).

Anything else returns None and the loader keeps transformers' conversion: Gemma's
sentencepiece files (their tokenizer class adds tokens and respells runs of spaces), a
``gpt2`` vocabulary whose ``tokenizer.ggml.pre`` is not in ``_SPLITS``, ``t5``, ``gemma4``.
The tokenizer comes back as Folio's tokenizer object (engine/text/file_tokenizer.py: the
backend transformers' tokenizers-backed class would build, without importing transformers),
with the file's special tokens, BOS / EOS flags and chat template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

TOKENIZER_ARRAYS = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                              "tokenizer.ggml.scores", "tokenizer.ggml.token_type"})
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types
_SPACE = "\u2581"  # SentencePiece's visible space
_UNK = "<unk>"
_SPECIALS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
             "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}
# Sentencepiece architectures whose tokenizer transformers builds with a class of its own.
_OWN_SPM_CLASSES = ("gemma", "gemma2", "gemma3")

# The pre-tokenizer split of each model family, as its own tokenizer.json states it, by
# the name llama.cpp's converter writes in tokenizer.ggml.pre.
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLITS: dict[str, str | None] = {
    "default": None, "gpt2": None, "smollm": None,  # GPT-2's own split (ByteLevel's regex)
    "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "llama-v3": _LLAMA3, "smaug-bpe": _LLAMA3,
    "dbrx": _LLAMA3, "falcon3": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
}


def byte_alphabet() -> dict[int, str]:
    """GPT-2's spelling of bytes as characters: the printable Latin-1 ones as themselves,
    the other bytes as the characters from U+0100 on, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    spelling, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            spelling[byte] = chr(byte)
        else:
            spelling[byte] = chr(256 + extra)
            extra += 1
    return spelling


def built_here(metadata: Mapping[str, object]) -> bool:
    """Whether ``build_tokenizer`` builds this file's tokenizer (else transformers does)."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind == "gpt2":
        return metadata.get("tokenizer.ggml.pre", "default") in _SPLITS
    return kind == "llama" and metadata.get("general.architecture") not in _OWN_SPM_CLASSES


def build_tokenizer(metadata: Mapping[str, object]):
    """The tokenizer of a GGUF whose header was read with ``TOKENIZER_ARRAYS`` whole, or
    None where ``built_here`` says no. ValueError when its keys are inconsistent."""
    if not built_here(metadata):
        return None
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ValueError("tokenizer.ggml.tokens is missing or empty")
    byte_level = metadata["tokenizer.ggml.model"] == "gpt2"
    core = _byte_level(metadata, tokens) if byte_level else _sentencepiece(metadata, tokens)
    _add_marked_tokens(core, metadata, tokens, byte_level)
    return _wrapped(core, metadata, tokens, byte_level)


def _byte_level(metadata: Mapping[str, object], tokens: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    alphabet = byte_alphabet()
    letters = set(alphabet.values())
    # A token outside the byte alphabet (written in plain UTF-8 by some converters) is
    # spelled in it; a later duplicate takes the id, as a dict does.
    vocab = {token if set(token) <= letters
             else "".join(alphabet[b] for b in token.encode("utf-8")): index
             for index, token in enumerate(tokens)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=_merges(metadata, tokens), dropout=None,
                                continuing_subword_prefix="", end_of_word_suffix="",
                                fuse_unk=False))
    split = _SPLITS[metadata.get("tokenizer.ggml.pre", "default")]
    if split is None:
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        core.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    return core


def _sentencepiece(metadata: Mapping[str, object], tokens: list[str]):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {token: index for index, token in enumerate(tokens)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=_merges(metadata, tokens), dropout=None,
                                fuse_unk=True, byte_fallback=True))
    if metadata.get("general.architecture") == "phi3":
        # Phi-3 puts its space before the text by a normalizer: "  hi" is three spaces'
        # worth of "▁" before "hi", not the two Metaspace would give.
        core.normalizer = normalizers.Sequence([normalizers.Prepend(_SPACE),
                                                normalizers.Replace(" ", _SPACE)])
    else:
        core.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SPACE,
                                                      prepend_scheme="first", split=False)
    core.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(),
                                      decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return core


def _merges(metadata: Mapping[str, object], tokens: list[str]) -> list[tuple[str, str]]:
    """The file's merges, or, where it lists none, every split of a token into two tokens,
    the best token's first (by score, else by id), each token's splits by their parts' ids,
    then shorter left parts, then shorter right parts."""
    listed = metadata.get("tokenizer.ggml.merges")
    if isinstance(listed, list):
        return [tuple(merge.split(" ", 1)) for merge in listed]  # type: ignore[misc]
    ids = {token: index for index, token in enumerate(tokens)}
    scores = metadata.get("tokenizer.ggml.scores")
    by_score = isinstance(scores, list) and len(scores) == len(tokens)
    rank = dict(zip(tokens, scores, strict=True)) if by_score else ids
    found: list[tuple[str, str, float]] = []
    for token, value in rank.items():
        splits = [(token[:cut], token[cut:]) for cut in range(1, len(token))
                  if token[:cut] in ids and token[cut:] in ids]
        splits.sort(key=lambda pair: (ids[pair[0]], ids[pair[1]]))
        found += [(left, right, value) for left, right in splits]
    # Stable: equal keys keep the order above (reverse=True keeps it too).
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=by_score)
    return [(left, right) for left, right, _ in found]


def _add_marked_tokens(core, metadata: Mapping[str, object], tokens: Sequence[str],
                       byte_level: bool) -> None:
    """Control tokens (``<|im_end|>``) as special added tokens, user-defined ones
    (``<think>``) as plain added tokens: both matched whole in text, as llama.cpp does. In a
    byte-level vocabulary a control token outside the byte alphabet is a mislabel of
    llama.cpp's converter and is left out (it would add a token past the model's rows)."""
    from tokenizers import AddedToken

    types = metadata.get("tokenizer.ggml.token_type")
    if not isinstance(types, list):
        return
    letters = set(byte_alphabet().values()) if byte_level else None
    control = [AddedToken(token, normalized=False, special=True)
               for token, kind in zip(tokens, types, strict=False)
               if kind == _CONTROL and (letters is None or set(token) <= letters)]
    if not byte_level and _UNK in core.get_vocab():
        # Sentencepiece's unknown piece is special whether or not the file names it (as
        # in transformers' Llama tokenizer): "<unk>" in text is that one token.
        control.insert(0, AddedToken(_UNK, normalized=False, special=True))
    if control:
        core.add_special_tokens(control)
    vocab = core.get_vocab()
    user = [AddedToken(token, normalized=False, special=False)
            for token, kind in zip(tokens, types, strict=False)
            if kind == _USER_DEFINED and token in vocab]
    if user:
        core.add_tokens(user)


def _wrapped(core, metadata: Mapping[str, object], tokens: Sequence[str], byte_level: bool):
    """``core`` with the file's special tokens (by their ids), BOS / EOS flags and chat
    template, as Folio's tokenizer object (what transformers' tokenizers-backed class
    would make of them, without importing transformers)."""
    from engine.text.file_tokenizer import FileTokenizer

    special: dict[str, str | None] = {}
    for name, key in _SPECIALS.items():
        index = metadata.get(f"tokenizer.ggml.{key}")
        if index is not None and not 0 <= int(index) < len(tokens):
            raise ValueError(f"tokenizer.ggml.{key} is {index}, past the vocabulary's "
                             f"{len(tokens)} tokens")
        special[name] = None if index is None else tokens[int(index)]
    # Older sentencepiece files have no flag, and llama.cpp adds BOS to those.
    add_bos = metadata.get("tokenizer.ggml.add_bos_token", None if byte_level else True)
    add_eos = metadata.get("tokenizer.ggml.add_eos_token")
    template = metadata.get("tokenizer.chat_template")
    return FileTokenizer(core, special,
                         add_bos_token=None if add_bos is None else bool(add_bos),
                         add_eos_token=None if add_eos is None else bool(add_eos),
                         chat_template=template if isinstance(template, str) else None)


def convert_with_transformers(path: Path):
    """The file's tokenizer as transformers converts it. transformers' GGUF support lists
    the architectures it builds models of, and AutoTokenizer reads the file's config
    through that list; for an architecture outside it (OLMoE) the tokenizer, which is
    the same GGUF vocabulary whatever the model, converts through the fast class itself,
    as for a config transformers' reader rejects (Gemma 4's per-layer head counts)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name,
                                             local_files_only=True)
    except TypeError:
        # transformers 5.24's gpt-oss reader turns its rope.scaling.* keys into numbers
        # from the wrong part of the field and fails; the vocabulary does not need them.
        pass
    except Exception as exc:  # huggingface_hub's validation error is no ValueError
        if not any(text in str(exc) for text in _CONFIG_REJECTIONS):
            raise
    return PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name,
                                                   local_files_only=True)


# What transformers says when it cannot build a GGUF file's config for AutoTokenizer.
_CONFIG_REJECTIONS = ("is not supported yet", "Validation error for field")
