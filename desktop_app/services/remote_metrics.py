"""A remote server's KV-cache figures, read from its Prometheus ``/metrics`` page.

Folio (``folio serve``), vLLM and SGLang publish their KV cache in their own names;
``parse_metrics`` reads whichever is there and returns None when none is. ``MetricsPoller``
fetches the page on its own thread, at most every 2 s, so the memory panel only ever
reads the latest snapshot and never waits for the network.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

METRICS_INTERVAL_S = 2.0
METRICS_TIMEOUT_S = 2.0
MAX_METRICS_BYTES = 4 << 20


@dataclass(slots=True, frozen=True)
class RemoteMetrics:
    flavor: str  # "Folio", "vLLM" or "SGLang": whose names the figures came in
    usage: float | None = None  # fraction of the KV cache in use
    hit_rate: float | None = None  # prefix-cache hit rate, 0..1
    running: int | None = None
    waiting: int | None = None
    blocks_used: int | None = None  # Folio only: the block counts
    blocks_free: int | None = None
    blocks_cached: int | None = None
    blocks_total: int | None = None


@dataclass(slots=True, frozen=True)
class RemoteStatus:
    """What the memory panel shows for a model served by another machine."""

    host: str
    base_url: str
    model: str
    metrics: RemoteMetrics | None = None
    note: str = ""  # why there are no metrics ("" while the first poll is out)
    checked: bool = False  # whether a poll has answered yet


def metrics_url(base_url: str) -> str:
    """``http://h:8000/v1`` -> ``http://h:8000/metrics`` (Prometheus sits at the root)."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[:-3]
    return root + "/metrics"


def parse_metrics(text: str) -> RemoteMetrics | None:
    """The KV-cache figures of a Prometheus text page, or None when it has none we know."""
    samples: dict[str, list[tuple[dict, float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    except Exception:  # noqa: BLE001 - not Prometheus text (an HTML page, garbage)
        return None

    def total(*names: str) -> float | None:
        for name in names:
            if name in samples:
                return sum(value for _, value in samples[name])
        return None

    def mean(*names: str) -> float | None:
        for name in names:
            if samples.get(name):
                return sum(v for _, v in samples[name]) / len(samples[name])
        return None

    def by_state(name: str) -> dict[str, float]:
        return {labels.get("state", ""): value for labels, value in samples.get(name, [])}

    if "folio_kv_blocks" in samples:
        blocks, flight = by_state("folio_kv_blocks"), by_state("folio_requests_in_flight")
        num = total("folio_kv_blocks_total")
        used = blocks.get("used")
        return RemoteMetrics(
            "Folio", usage=used / num if num and used is not None else None,
            hit_rate=total("folio_prefix_cache_hit_rate"), running=_int(flight.get("running")),
            waiting=_int(flight.get("waiting")), blocks_used=_int(used),
            blocks_free=_int(blocks.get("free")), blocks_cached=_int(blocks.get("cached")),
            blocks_total=_int(num))
    usage = mean("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc")
    if usage is not None or "vllm:num_requests_running" in samples:
        hit_rate = mean("vllm:gpu_prefix_cache_hit_rate")
        if hit_rate is None:
            hits = total("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
            queries = total("vllm:prefix_cache_queries_total",
                            "vllm:gpu_prefix_cache_queries_total")
            hit_rate = hits / queries if hits is not None and queries else None
        return RemoteMetrics("vLLM", usage=usage, hit_rate=hit_rate,
                             running=_int(total("vllm:num_requests_running")),
                             waiting=_int(total("vllm:num_requests_waiting")))
    usage = mean("sglang:token_usage")
    if usage is not None or "sglang:num_running_reqs" in samples:
        return RemoteMetrics("SGLang", usage=usage, hit_rate=mean("sglang:cache_hit_rate"),
                             running=_int(total("sglang:num_running_reqs")),
                             waiting=_int(total("sglang:num_queue_reqs")))
    return None


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def fetch_metrics(url: str, api_key: str = "", timeout: float = METRICS_TIMEOUT_S) -> str:
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        return response.read(MAX_METRICS_BYTES).decode("utf-8", "replace")


class MetricsPoller:
    """Polls ``url`` on a daemon thread every ``interval_s``; ``latest()`` never blocks
    on the network."""

    def __init__(self, url: str, api_key: str = "",
                 interval_s: float = METRICS_INTERVAL_S) -> None:
        self.url, self._api_key = url, api_key
        self.interval_s = max(interval_s, 0.05)
        self._lock = threading.Lock()
        self._latest: tuple[RemoteMetrics | None, str, bool] = (None, "", False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.polls = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="folio-remote-metrics",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def latest(self) -> tuple[RemoteMetrics | None, str, bool]:
        """(metrics or None, why there are none, whether a poll answered yet)."""
        with self._lock:
            return self._latest

    def poll_once(self) -> None:
        try:
            text = fetch_metrics(self.url, self._api_key, min(METRICS_TIMEOUT_S,
                                                              self.interval_s * 2))
        except urllib.error.HTTPError as exc:
            result = (None, f"The server has no metrics page ({self.url} answered "
                      f"{exc.code}).", True)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            result = (None, f"Could not read {self.url}: {reason}.", True)
        else:
            metrics = parse_metrics(text)
            note = "" if metrics else (f"{self.url} shows no KV-cache figures in Folio's, "
                                       "vLLM's or SGLang's names.")
            result = (metrics, note, True)
        with self._lock:
            self._latest = result
            self.polls += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.poll_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
