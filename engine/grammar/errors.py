"""Why a response format is not compiled: the schema's fault, or the server's load."""

from __future__ import annotations


class GrammarError(ValueError):
    """A response format the engine cannot enforce; ``construct`` names the keyword."""

    def __init__(self, construct: str, message: str) -> None:
        super().__init__(message)
        self.construct = construct


class GrammarBusy(RuntimeError):
    """Schemas that ran past the compile time limit are still compiling in the background:
    a new schema waits for them to end rather than adding another such compile. Not the
    request's fault (the same schema may compile at once later), so no ValueError."""
