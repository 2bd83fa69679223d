"""The local side of ``services.worker_protocol.ModelWorker``: engine.EngineWorker with the
model facts the bridge reads and the one answer it lacks (a local model has no server
figures).

A subclass rather than a wrapper: the app's API (services.api_server) serves over this very
worker, so API requests join the chats' batch and prefix cache, and engine.serve takes an
EngineWorker.
"""

from __future__ import annotations

from desktop_app.services.worker_protocol import ModelFacts
from engine.worker import EngineWorker


class LocalWorker(ModelFacts, EngineWorker):
    is_remote = False

    def remote_status(self) -> None:
        return None

