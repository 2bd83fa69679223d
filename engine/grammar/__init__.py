"""Structured output: a reply constrained to JSON, or to a JSON schema, by a token mask.

``limits.py`` measures a schema first (depth, sub-schemas, enum values, literal text),
without recursing; ``schema_check.py`` refuses what the grammar engine would not enforce;
``compiler.py`` compiles a ``ResponseFormat`` once per schema (xgrammar), each schema on
a thread of its own behind a future its requests share; ``matcher.py`` is one
candidate's state and the batch's masks. The engine holds a matcher per constrained
candidate and the sampler applies the masks (``engine/runner/sampler.py``).
"""

from engine.grammar.compiler import Compiling, Grammars
from engine.grammar.errors import GrammarBusy, GrammarError
from engine.grammar.matcher import Matcher, token_masks
from engine.grammar.schema_check import check_schema

__all__ = ["Compiling", "GrammarBusy", "GrammarError", "Grammars", "Matcher", "check_schema",
           "token_masks"]
