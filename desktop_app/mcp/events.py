"""What the MCP hub reports, from its own thread: typed events, one dataclass each."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# A server's states: starting -> ready; failed (would not start, or crashed) and stopped.
STARTING, READY, FAILED, STOPPED = "starting", "ready", "failed", "stopped"


@dataclass(slots=True, frozen=True)
class ToolInfo:
    server: str
    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.server}/{self.name}"


@dataclass(slots=True, frozen=True)
class ServerStatus:
    name: str
    state: str
    tools: tuple[ToolInfo, ...] = ()
    error: str = ""  # why it failed, secrets taken out


@dataclass(slots=True, frozen=True)
class CallResult:
    """A tool call's outcome. ``error`` set: the call failed (the server said so, exited,
    timed out, or could not start) and ``text`` is what the model is told."""

    call_id: str
    text: str
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


McpEvent = ServerStatus | CallResult
