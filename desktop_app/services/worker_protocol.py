"""What ``EngineBridge`` asks of a loaded model: one Protocol, a local and a remote side.

``ModelWorker`` is the whole surface the bridge calls: the model's facts, the requests, the
memory figures and the worker's life. The local side is ``services.local_worker.LocalWorker``
(engine.EngineWorker over engine.LLM), the remote one ``services.remote.RemoteWorker`` (an
OpenAI-compatible server). Where they differ each answers for itself: a remote model has no
prompt builder, tokenizer, KV figures or disk tier (``preload`` and ``clear_disk`` do
nothing, the stats are None) and no activity events (the bridge's own requests say when it
is busy); a local one has no server figures (``remote_status`` is None). So the bridge never
asks which kind it holds. The tests' fake workers implement the same Protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from desktop_app.services.remote_metrics import RemoteStatus
    from engine.chat import PromptBuilder
    from engine.core.kv_stats import KVStats
    from engine.outputs import ActivityEvent, Event
    from engine.runner.memory import MemoryStats
    from engine.sampling_params import SamplingParams

EventCallback = Callable[["Event"], None]


class ModelFacts:
    """The model facts every worker reads off its model (``self.llm``: an engine.LLM, a
    RemoteLLM, a test's fake), so each side states them once."""

    llm: Any

    @property
    def model_name(self) -> str:
        return self.llm.model_name

    @property
    def max_model_len(self) -> int:
        return self.llm.max_model_len

    @property
    def tokenizer(self) -> Any:
        return self.llm.tokenizer

    @property
    def prompts(self) -> PromptBuilder | None:
        return self.llm.prompts

    @property
    def sees_images(self) -> bool:
        """Whether the model reads images: its prompt builder has a vision encoder
        (engine/vision); a model without a builder says so itself."""
        prompts = self.llm.prompts
        if prompts is not None:
            return getattr(prompts, "vision", None) is not None
        return bool(getattr(self.llm, "sees_images", False))

    @property
    def beam_search_refusal(self) -> str | None:
        """Why this model runs no beam search, None where it does: the engine's own
        reason (a model without an engine, as the tests' fakes, runs none either)."""
        engine = getattr(self.llm, "engine", None)
        if engine is None:
            return "this model has no engine to run a beam search"
        return engine.beam_search_refusal()


class RequestHandle(Protocol):
    request_id: str

    def cancel(self) -> None: ...


@runtime_checkable
class ModelWorker(Protocol):
    """A loaded model and the worker that runs its requests. Callbacks (``on_event``, the
    activity listener) run on the worker's own threads: they may only hand events on."""

    # -- the model ---------------------------------------------------------------------
    @property
    def model_name(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (drafts are counted with it); None for a remote model."""

    @property
    def prompts(self) -> PromptBuilder | None:
        """The engine's prompt builder (prompts are measured and built with it); None for
        a remote model, which is sent the messages."""

    @property
    def is_remote(self) -> bool: ...

    @property
    def beam_search_refusal(self) -> str | None:
        """Why the model runs no beam search (the chat's choice greyed out with it), None
        where it does."""

    # -- requests ----------------------------------------------------------------------
    def submit(self, prompt: Any, params: SamplingParams | None,
               on_event: EventCallback) -> RequestHandle: ...

    def cancel(self, request_id: str) -> None: ...

    def preload(self, prompt: Any) -> None:
        """Load the blocks of ``prompt`` kept on disk ahead of its turn (may do nothing)."""

    # -- figures -----------------------------------------------------------------------
    def kv_stats(self) -> KVStats | None: ...

    def memory_stats(self) -> MemoryStats | None: ...

    def remote_status(self) -> RemoteStatus | None: ...

    def clear_disk(self) -> None: ...

    def set_activity_listener(self, listener: Callable[[ActivityEvent], None] | None
                              ) -> None: ...

    # -- life --------------------------------------------------------------------------
    def start(self) -> ModelWorker: ...

    def shutdown(self) -> None: ...
