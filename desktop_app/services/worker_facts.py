"""What the bridge tells of the picker's model, read from its worker
(services.worker_protocol.ModelWorker): None, or nothing done, while none is loaded.
``WorkerFacts`` is a mixin of EngineBridge, which sets ``_worker``."""

from __future__ import annotations

from desktop_app.services.worker_protocol import ModelWorker


class WorkerFacts:
    _worker: ModelWorker | None = None

    @property
    def is_loaded(self) -> bool:
        return self._worker is not None

    @property
    def model_name(self) -> str | None:
        return None if self._worker is None else self._worker.model_name

    @property
    def max_model_len(self) -> int | None:
        return None if self._worker is None else self._worker.max_model_len

    @property
    def tokenizer(self):
        return None if self._worker is None else self._worker.tokenizer

    @property
    def prompts(self):
        """The loaded model's prompt builder (engine.chat.PromptBuilder): what the context
        planner measures with and the prompts it submits come from; None for a remote
        model or none loaded (the planner estimates, the messages are sent)."""
        return None if self._worker is None else self._worker.prompts

    @property
    def sees_images(self) -> bool | None:
        """Whether the picker's model reads images; None for a server's model (Folio
        cannot tell: the server answers for it), False while none is loaded."""
        if self._worker is None:
            return False
        if self._worker.is_remote:
            return None
        return bool(getattr(self._worker, "sees_images", False))

    @property
    def beam_search_refusal(self) -> str | None:
        """Why the picker's model runs no beam search (the engine's reason, or a
        server's), None where it does or while none is loaded."""
        return None if self._worker is None else self._worker.beam_search_refusal

    @property
    def worker(self) -> ModelWorker | None:
        """The running worker (a LocalWorker, or a RemoteWorker), None when unloaded."""
        return self._worker

    @property
    def is_remote(self) -> bool:
        return self._worker is not None and self._worker.is_remote

    def remote_status(self):
        """The server's figures (services.remote_metrics.RemoteStatus) for a remote model,
        None for a local one."""
        return None if self._worker is None else self._worker.remote_status()

    def kv_stats(self):
        return None if self._worker is None else self._worker.kv_stats()

    def memory_stats(self):
        return None if self._worker is None else self._worker.memory_stats()

    def preload(self, prompt) -> None:
        """A chat was opened: its history's blocks on disk are loaded ahead of its next
        turn, when the engine has nothing else to do (a remote worker does nothing)."""
        if self._worker is not None:
            self._worker.preload(prompt)

    def clear_disk(self) -> None:
        """Remove the KV cache's disk tier files (the memory panel's Clear)."""
        if self._worker is not None:
            self._worker.clear_disk()
