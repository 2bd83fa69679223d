"""The local side of ``services.worker_protocol.ModelWorker``: engine.EngineWorker with the
model facts the bridge reads and the one answer it lacks (a local model has no server
figures).

A subclass rather than a wrapper: the app's API (services.api_server) serves over this very
worker, so API requests join the chats' batch and prefix cache, and engine.serve takes an
EngineWorker.
"""

from __future__ import annotations

from engine.worker import EngineWorker


class LocalWorker(EngineWorker):
    is_remote = False

    @property
    def model_name(self) -> str:
        return self.llm.model_name

    @property
    def max_model_len(self) -> int:
        return self.llm.max_model_len

    @property
    def tokenizer(self):
        return self.llm.tokenizer

    @property
    def prompts(self):
        return self.llm.prompts

    def remote_status(self) -> None:
        return None
