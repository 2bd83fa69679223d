"""A ``ResponseFormat`` compiled, once per schema, to the grammar a ``Matcher`` follows.

xgrammar was chosen by measuring (README, Structured output): its per-token mask cost
stays small from the 49k to a 152k vocabulary, a 20-field schema compiles well under the
first-use target and a cached one is a dictionary lookup. Its tokenizer table is built on
the first constrained request, so loading a model costs nothing when JSON is never asked.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from engine.grammar.errors import GrammarError
from engine.grammar.matcher import Matcher
from engine.grammar.schema_check import check_schema
from engine.sampling_params import ResponseFormat

_CACHE_SIZE = 64  # compiled grammars kept, least recently used dropped first
# json_object is any JSON object (OpenAI's JSON mode never answers an array or a string).
_ANY_OBJECT = {"type": "object"}
# xgrammar writes a length-bounded string's characters as this class, which lets raw
# control characters through (JSON forbids them unescaped); its unbounded strings use the
# right class, which replaces it.
_LOOSE_CHARACTER = r'[^\"\\\r\n]'
_STRING_CHARACTER = r'[^\0-\x1f\"\\]'


def _xgrammar():
    import xgrammar  # noqa: PLC0415 - heavy, and only for constrained requests

    return xgrammar


class Grammars:
    """``grammars.matcher(fmt)``: a fresh matcher for one candidate; GrammarError (a
    ValueError naming the construct) for a schema that cannot be enforced.

    ``tokenizer`` is the Hugging Face tokenizer, ``vocab_size`` the logits' width (it may
    exceed the tokenizer's), ``stop_ids`` the tokens that end a reply once it is complete.
    Thread-safe: the server checks a schema on its own thread while the engine steps.
    """

    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int]) -> None:
        self._tokenizer, self.vocab_size, self._stop_ids = tokenizer, vocab_size, stop_ids
        self._compiler = None
        self._cache: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    def _ready(self):
        if self._compiler is None:
            xg = _xgrammar()
            info = xg.TokenizerInfo.from_huggingface(
                self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._stop_ids)
            self._compiler = xg.GrammarCompiler(info)
        return self._compiler

    def compile(self, fmt: ResponseFormat):
        """The compiled grammar of ``fmt``, from the cache when it was compiled before."""
        strict = fmt.type == "json_schema"
        schema = fmt.schema if strict else _ANY_OBJECT
        if strict:  # the limits first: json.dumps of a schema nested too deep never runs
            check_schema(schema)
        key = json.dumps([strict, schema], sort_keys=True)
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
                return compiled
            compiler = self._ready()
            try:
                # Separators without free whitespace: a model cannot pad a reply with
                # newlines until max_tokens, which free whitespace would let it do.
                grammar = _xgrammar().Grammar.from_json_schema(
                    json.dumps(schema), any_whitespace=False, strict_mode=strict)
                text = str(grammar).replace(_LOOSE_CHARACTER, _STRING_CHARACTER)
                compiled = compiler.compile_grammar(text)
            except (RuntimeError, ValueError) as exc:  # xgrammar's message names the construct
                message = str(exc).splitlines()[0].split(": ", 1)[-1]
                raise GrammarError("schema", f"the schema cannot be compiled: {message}") \
                    from exc
            self._cache[key] = compiled
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
            return compiled

    def matcher(self, fmt: ResponseFormat) -> Matcher:
        return Matcher(_xgrammar().GrammarMatcher(self.compile(fmt)), self.vocab_size)
