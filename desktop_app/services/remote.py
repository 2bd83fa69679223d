"""Remote OpenAI-compatible servers (vLLM, SGLang, ``folio serve``) as a model source.

``RemoteWorker`` is the remote side of services.worker_protocol.ModelWorker (``RemoteLLM``
the model on the server), and a request emits the engine's own TokenEvent / FinishedEvent /
ErrorEvent (from a background thread, as the engine's worker does), so the bridge, the
chat controller and the views treat a remote model like a local one. What differs:
``kv_stats()`` / ``memory_stats()`` are None (the KV cache is on another machine),
``remote_status()`` reports the server's own figures from its ``/metrics`` page, there is
no prompt builder or tokenizer here (the messages are sent), nothing on disk to preload or
clear, and no activity events (the bridge's own requests say when it is busy).

The API key goes only into the Authorization header: never into a source string, a
log line, a repr or an error message.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import openai

from desktop_app.data.servers import host_of, normalize_base_url
from desktop_app.services.remote_client import (
    READ_TIMEOUT_S,
    ModelCard,
    RemoteError,
    list_models,
    make_client,
)
from desktop_app.services.remote_metrics import (
    METRICS_INTERVAL_S,
    MetricsPoller,
    RemoteStatus,
    metrics_url,
)
from desktop_app.services.remote_request import RemoteRequest
from desktop_app.services.worker_protocol import ModelFacts
from engine.outputs import ErrorEvent, FinishedEvent
from engine.sampling_params import SamplingParams

DEFAULT_MAX_MODEL_LEN = 8192
__all__ = ["DEFAULT_MAX_MODEL_LEN", "ModelCard", "RemoteError", "RemoteLLM", "RemoteWorker",
           "list_models"]


class RemoteLLM:
    """A model on a remote server: where it is, its name and context, and clients on it."""

    tokenizer = None  # the server's: a draft is estimated (context_policy.estimate_tokens)
    prompts = None  # the server renders its template: the messages are sent

    def __init__(self, base_url: str, model: str, api_key: str = "",
                 max_model_len: int | None = None) -> None:
        self.base_url = normalize_base_url(base_url)
        self.model_name = model
        self.max_model_len = max_model_len or DEFAULT_MAX_MODEL_LEN
        self._api_key = api_key

    @property
    def host(self) -> str:
        return host_of(self.base_url)

    def __repr__(self) -> str:
        return f"RemoteLLM({self.base_url!r}, {self.model_name!r})"

    def client(self, read_timeout: float = READ_TIMEOUT_S) -> openai.OpenAI:
        return make_client(self.base_url, self._api_key, read_timeout)

    def metrics_poller(self, interval_s: float) -> MetricsPoller:
        return MetricsPoller(metrics_url(self.base_url), self._api_key, interval_s)

    @classmethod
    def connect(cls, base_url: str, model: str, api_key: str = "",
                progress: Callable[[str, float], None] | None = None) -> RemoteLLM:
        """Check that the server answers and serves ``model``; raises RemoteError."""
        if progress:
            progress(f"connecting to {host_of(base_url)}", 0.2)
        cards = {card.id: card for card in list_models(base_url, api_key)}
        if model not in cards:
            raise RemoteError(f"The server at {base_url} does not serve {model!r}; it "
                              f"serves {', '.join(sorted(cards))}.")
        if progress:
            progress("connected", 1.0)
        return cls(base_url, model, api_key, cards[model].max_model_len)


class RemoteHandle:
    __slots__ = ("request_id", "_worker")

    def __init__(self, request_id: str, worker: RemoteWorker) -> None:
        self.request_id, self._worker = request_id, worker

    def cancel(self) -> None:
        self._worker.cancel(self.request_id)


class RemoteWorker(ModelFacts):
    """Requests to a remote server, each streamed on its own thread."""

    is_remote = True
    # The app streams a server's replies, and vLLM's use_beam_search answers in one piece
    # (Folio's server refuses it with stream): not sent.
    beam_search_refusal = ("it runs on this computer's models only (a server's replies "
                           "stream, and a beam search answers in one piece)")

    def __init__(self, llm: RemoteLLM, metrics_interval_s: float = METRICS_INTERVAL_S) -> None:
        self.llm = llm
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._requests: dict = {}
        self._poller = llm.metrics_poller(metrics_interval_s)

    def start(self) -> RemoteWorker:
        self._poller.start()
        return self

    def submit(self, messages, params, on_event, label: str = "chat") -> RemoteHandle:
        request_id = f"{label}-{next(self._ids)}"

        def forward(event) -> None:
            if isinstance(event, FinishedEvent | ErrorEvent):
                with self._lock:
                    self._requests.pop(request_id, None)
            on_event(event)

        request = RemoteRequest(request_id, self.llm, messages, params or SamplingParams(),
                                forward)
        with self._lock:
            self._requests[request_id] = request
        request.start()
        return RemoteHandle(request_id, self)

    def cancel(self, request_id: str) -> None:
        """Closes the HTTP stream; the request ends at once with finish reason "abort"."""
        with self._lock:
            request = self._requests.get(request_id)
        if request is not None:
            request.cancel()

    def in_flight(self) -> list[str]:
        with self._lock:
            return list(self._requests)

    def kv_stats(self):
        return None  # the KV cache is on the server: see remote_status()

    def memory_stats(self):
        return None

    def preload(self, prompt) -> None:
        """The server keeps its own cache: nothing to load ahead from here."""

    def clear_disk(self) -> None:
        """No disk tier of ours holds a remote model's blocks."""

    def set_activity_listener(self, listener) -> None:
        """The server's other clients are not seen: the bridge's requests tell busy."""

    def remote_status(self) -> RemoteStatus:
        metrics, note, checked = self._poller.latest()
        return RemoteStatus(self.llm.host, self.llm.base_url, self.llm.model_name, metrics,
                            note, checked)

    def shutdown(self, timeout: float = 5.0) -> None:
        self._poller.stop()
        for request_id in self.in_flight():
            self.cancel(request_id)
