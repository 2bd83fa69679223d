"""A ``ResponseFormat`` compiled, once per schema, to the grammar a ``Matcher`` follows.

xgrammar was chosen by measuring (README, Structured output): its per-token mask cost
stays small from the 49k to a 152k vocabulary, a 20-field schema compiles well under the
first-use target and a cached one is a dictionary lookup. Its tokenizer table is built on
the first constrained request, so loading a model costs nothing when JSON is never asked.

Each schema compiles on a thread of its own, behind a future that every request for that
schema shares (``Compiling``): a slow schema holds up only the requests that asked for
it, and nothing holds a lock across a compile.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass

from engine.grammar import limits
from engine.grammar.errors import GrammarBusy, GrammarError
from engine.grammar.matcher import Matcher
from engine.grammar.schema_check import check_schema
from engine.sampling_params import ResponseFormat
from engine.text.file_tokenizer import as_transformers

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


@dataclass(slots=True)
class Compiling:
    """A schema's compile, done or in flight, shared by every request for that schema:
    ``result()`` blocks for its grammar, ``await wait()`` holds no thread meanwhile. Past
    ``deadline`` either is a GrammarError naming compile time, while the compile runs on."""

    future: Future
    deadline: float  # time.monotonic()
    timeout_s: float

    @classmethod
    def done(cls, compiled) -> Compiling:
        future: Future = Future()
        future.set_result(compiled)
        return cls(future, 0.0, 0.0)

    def result(self):
        if self.future.done():
            return self.future.result()
        try:
            return self.future.result(self._left())
        except TimeoutError:
            raise self._too_slow() from None

    async def wait(self):
        if self.future.done():
            return self.future.result()
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self.future), self._left())
        except TimeoutError:
            raise self._too_slow() from None

    def _left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def _too_slow(self) -> GrammarError:
        return GrammarError("compile time", "the schema took too long to compile (more than "
                            f"{self.timeout_s:g} s); simplify it, e.g. fewer optional "
                            "properties or shorter patterns")


class Grammars:
    """``grammars.compile(fmt)``: ``fmt``'s compiled grammar (``start(fmt)``: its compile,
    to await); ``grammars.matcher(fmt)``: a fresh matcher for one candidate. GrammarError
    (a ValueError naming the construct) for a schema that cannot be enforced, is past a
    limit (``limits.py``) or took too long.

    ``tokenizer`` is the model's tokenizer (transformers' or Folio's own, which xgrammar's
    vocabulary table gets as transformers' class on first use), ``vocab_size`` the
    logits' width (it may exceed the tokenizer's), ``stop_ids`` the tokens that end a
    reply once it is complete.
    Thread-safe: the server compiles on its own threads while the engine steps.
    """

    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int]) -> None:
        self._tokenizer, self.vocab_size, self._stop_ids = tokenizer, vocab_size, stop_ids
        self.compile_timeout_s = limits.COMPILE_TIMEOUT_S
        self._compiler = None
        self._compiler_lock = threading.Lock()  # held while the tokenizer table is built
        self._cache: OrderedDict[str, object] = OrderedDict()
        self._compiling: dict[str, Compiling] = {}
        self._lock = threading.Lock()  # the cache and the compiles in flight, briefly

    def compile(self, fmt: ResponseFormat):
        """The compiled grammar of ``fmt``, waiting for its compile (``start``)."""
        return self.start(fmt).result()

    def start(self, fmt: ResponseFormat) -> Compiling:
        """``fmt``'s compile: done when its grammar is cached, else the one in flight for
        its schema, else a new one. A compile that runs past ``compile_timeout_s`` is a
        GrammarError for everyone waiting on it, then and after (it runs on and caches its
        grammar when it ends); GrammarBusy while too many such compiles run. Reads the
        whole schema (the checks, the cache key): call it off an event loop."""
        key, strict, schema = _key(fmt)
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
                return Compiling.done(compiled)
            return self._compiling.get(key) or self._start(key, strict, schema)

    def matcher(self, fmt: ResponseFormat, compiled=None) -> Matcher:
        """A fresh matcher for one candidate; ``compiled``: ``fmt``'s grammar from
        ``compile``, where the caller has it (the engine's thread then compiles nothing)."""
        if compiled is None:
            compiled = self.compile(fmt)
        return Matcher(_xgrammar().GrammarMatcher(compiled), self.vocab_size)

    def _start(self, key: str, strict: bool, schema: dict) -> Compiling:
        now = time.monotonic()
        overdue = sum(c.deadline < now for c in self._compiling.values())
        if overdue >= limits.MAX_OVERDUE_COMPILES:
            raise GrammarBusy(f"{overdue} schemas that took too long to compile are still "
                              "compiling; retry once they are done")
        future: Future = Future()
        # Not cancellable from here on: an awaiting waiter that gives up cancels what it
        # awaits, which must not end the compile the others share.
        future.set_running_or_notify_cancel()
        running = Compiling(future, now + self.compile_timeout_s, self.compile_timeout_s)
        self._compiling[key] = running
        threading.Thread(target=self._run, args=(key, strict, schema, running.future),
                         name="folio-grammar", daemon=True).start()
        return running

    def _run(self, key: str, strict: bool, schema: dict, future: Future) -> None:
        try:
            compiled = _compile(self._ready(), strict, schema)
        except BaseException as exc:
            # Not cached: xgrammar refuses a schema as it reads it, before the costly
            # part, so the next request for it is refused as fast by compiling again,
            # and an error that was not the schema's (memory) does not stay.
            with self._lock:
                del self._compiling[key]
            future.set_exception(exc)
            return
        with self._lock:
            del self._compiling[key]
            self._cache[key] = compiled
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        future.set_result(compiled)

    def _ready(self):
        with self._compiler_lock:
            if self._compiler is None:
                xg = _xgrammar()
                info = xg.TokenizerInfo.from_huggingface(
                    as_transformers(self._tokenizer), vocab_size=self.vocab_size,
                    stop_token_ids=self._stop_ids)
                self._compiler = xg.GrammarCompiler(info)
            return self._compiler


def _key(fmt: ResponseFormat) -> tuple[str, bool, dict]:
    """The cache key of ``fmt``'s schema, once the schema passed the checks: the limits
    come first, so ``json.dumps`` of a schema nested too deep never runs."""
    strict = fmt.type == "json_schema"
    schema = fmt.schema if strict else _ANY_OBJECT
    if strict:
        check_schema(schema)
    return json.dumps([strict, schema], sort_keys=True), strict, schema


def _compile(compiler, strict: bool, schema: dict):
    """xgrammar's compile of one schema: the slow part, on a compile thread."""
    try:
        # Separators without free whitespace: a model cannot pad a reply with newlines
        # until max_tokens, which free whitespace would let it do.
        grammar = _xgrammar().Grammar.from_json_schema(
            json.dumps(schema), any_whitespace=False, strict_mode=strict)
        text = str(grammar).replace(_LOOSE_CHARACTER, _STRING_CHARACTER)
        return compiler.compile_grammar(text)
    except (RuntimeError, ValueError) as exc:  # xgrammar's message names the construct
        message = str(exc).splitlines()[0].split(": ", 1)[-1]
        raise GrammarError("schema", f"the schema cannot be compiled: {message}") from exc
