"""The models a server answers for: ``OneModel``, the one worker it was built over (the
desktop app's "serve the loaded model" switch), or ``HostedModels``, every model in a
library, each loaded on demand by a ModelHost (``folio serve``).

Both hand a request a lease on its model's worker (``await models.lease(name,
keep_alive)``) that the request ends with ``await release(lease)``; list the models for
``/v1/models`` and ``/v1/status``; and give ``/metrics`` its per-model gauges.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily

from engine.hosting import ModelHost, ModelWontFit, parse_keep_alive
from engine.hosting.library import ModelLibrary, UnknownModel
from engine.loaders.base import FolioLoadError
from engine.serve import responses
from engine.serve.errors import APIError
from engine.serve.host_metrics import hosted_families
from engine.serve.metrics import pool_families
from engine.worker import EngineWorker


class _Held:
    """OneModel's lease: its worker is never unloaded."""

    def __init__(self, name: str, worker: EngineWorker) -> None:
        self.name, self.worker = name, worker

    def release(self) -> None:
        pass


async def release(lease) -> None:
    """End a request's lease off the event loop (keep_alive 0 unloads the model there)."""
    await asyncio.shield(asyncio.to_thread(lease.release))  # a cancelled handler too


class OneModel:
    def __init__(self, worker: EngineWorker) -> None:
        self.worker = worker
        self.default_name = worker.llm.model_name

    async def lease(self, name: str, keep_alive=None) -> _Held:
        """`keep_alive` is checked and otherwise ignored: this model stays loaded."""
        _keep_alive(keep_alive, None)
        if name != self.default_name:
            raise APIError(404, f"model {name!r} is not served here; this server serves "
                           f"{self.default_name!r} (GET /v1/models)", "model_not_found",
                           "model")
        return _Held(name, self.worker)

    def cards(self) -> list[dict]:
        return [{**responses.model_card(self.worker.llm), "status": "loaded"}]

    def status(self) -> dict:
        stats = self.worker.memory_stats()
        kv = stats.kv_pool_bytes + stats.state_pool_bytes
        return {"budget_bytes": None, "used_bytes": stats.weights_bytes + kv,
                "keep_alive_s": None,
                "models": [{"id": self.default_name, "status": "loaded",
                            "weights_bytes": stats.weights_bytes, "kv_bytes": kv,
                            "total_bytes": stats.weights_bytes + kv, "running": None,
                            "idle_s": None, "keep_alive_s": None}]}

    def metric_families(self) -> Iterator[GaugeMetricFamily]:
        yield from pool_families(self.worker)


class HostedModels:
    def __init__(self, host: ModelHost, library: ModelLibrary, default_name: str) -> None:
        self.host, self.library, self.default_name = host, library, default_name

    async def lease(self, name: str, keep_alive=None):
        """A lease on `name`, loaded first if it is not (off the event loop): 404 for a
        name the library does not list, 503 when it cannot fit the memory budget."""
        keep = _keep_alive(keep_alive, self.host.keep_alive_s)
        try:
            name = await asyncio.to_thread(self.library.resolve, name)
        except UnknownModel as exc:
            raise APIError(404, str(exc), "model_not_found", "model") from exc
        leasing = asyncio.ensure_future(asyncio.to_thread(self.host.lease, name, keep))
        try:
            return await asyncio.shield(leasing)
        except ModelWontFit as exc:
            raise APIError(503, str(exc), "model_wont_fit", "model") from exc
        except FolioLoadError as exc:
            raise APIError(500, f"model {name!r} could not be loaded: {exc}",
                           "model_load_failed", "model") from exc
        except asyncio.CancelledError:
            # The client left while its model loaded: the lease, once there, is ended.
            leasing.add_done_callback(_release_when_leased)
            raise

    def cards(self) -> list[dict]:
        hosted = {m.name: m for m in self.host.models()}
        created = int(time.time())
        config = self.host.config
        return [{"id": name, "object": "model", "created": created, "owned_by": "folio",
                 "max_model_len": self.library.max_model_len(name, config),
                 "status": hosted[name].state if name in hosted else "unloaded"}
                for name in self.library.names()]

    def status(self) -> dict:
        return {"budget_bytes": self.host.budget_bytes, "used_bytes": self.host.used_bytes(),
                "keep_alive_s": self.host.keep_alive_s,
                "models": [{"id": m.name, "status": m.state, "weights_bytes": m.weights_bytes,
                            "kv_bytes": m.kv_bytes, "total_bytes": m.total_bytes,
                            "running": m.running, "idle_s": m.idle_s,
                            "keep_alive_s": m.keep_alive_s} for m in self.host.models()]}

    def metric_families(self) -> Iterator[GaugeMetricFamily]:
        return hosted_families(self.host, self.library.names())


def _keep_alive(value, default: float | None) -> float | None:
    if value is None:
        return default
    try:
        return parse_keep_alive(value)
    except ValueError as exc:
        raise APIError(400, str(exc), "invalid_value", "keep_alive") from exc


def _release_when_leased(leasing: asyncio.Future) -> None:
    if not leasing.cancelled() and leasing.exception() is None:
        threading.Thread(target=leasing.result().release, name="folio-lease-end",
                         daemon=True).start()
