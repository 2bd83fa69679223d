"""``GET /metrics`` in Prometheus' text format.

The KV-pool figures (one model's) or the hosted models' memory and state (several, see
models.py) are read when Prometheus scrapes, so they never lag; request and token counts
are counted as requests end. Each server has its own registry, so several apps in one
process (tests, the desktop app) never mix their series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from engine.outputs import RequestOutput
from engine.worker import EngineWorker

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


class ServerMetrics:
    def __init__(self, models: Callable[[], Iterator[GaugeMetricFamily]]) -> None:
        """`models`: the served models' gauges at each scrape."""
        self.registry = CollectorRegistry()
        self.waiting = 0  # submitted, no token yet
        self.running = 0  # streaming tokens
        self.registry.register(_Collector(models, self))
        self.requests = Counter("folio_requests", "API requests by endpoint and outcome",
                                ["endpoint", "outcome"], registry=self.registry)
        self.prompt_tokens = Counter("folio_prompt_tokens", "Prompt tokens of finished "
                                     "requests", registry=self.registry)
        self.cached_tokens = Counter("folio_prefix_cache_hit_tokens", "Prompt tokens served "
                                     "from the prefix cache", registry=self.registry)
        self.generated_tokens = Counter("folio_generation_tokens", "Tokens generated",
                                        registry=self.registry)
        self.ttft = Histogram("folio_time_to_first_token_seconds", "Time to first token",
                              buckets=TTFT_BUCKETS, registry=self.registry)

    def finished(self, endpoint: str, output: RequestOutput) -> None:
        m = output.metrics
        self.requests.labels(endpoint, "finished").inc()
        self.prompt_tokens.inc(m.num_prompt_tokens)
        self.cached_tokens.inc(m.num_cached_tokens)
        self.generated_tokens.inc(m.num_generated_tokens)
        if m.num_generated_tokens:
            self.ttft.observe(m.ttft_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Collector(Collector):
    def __init__(self, models: Callable[[], Iterator[GaugeMetricFamily]],
                 metrics: ServerMetrics) -> None:
        self.models, self.metrics = models, metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self.models()
        requests = GaugeMetricFamily("folio_requests_in_flight", "API requests in flight",
                                     labels=["state"])
        requests.add_metric(["waiting"], self.metrics.waiting)
        requests.add_metric(["running"], self.metrics.running)
        yield requests


def pool_families(worker: EngineWorker) -> Iterator[GaugeMetricFamily]:
    """One model's KV pool, from the worker's stats snapshot."""
    stats = worker.kv_stats()
    blocks = GaugeMetricFamily("folio_kv_blocks", "KV cache blocks by state",
                               labels=["state"])
    for state, count in (("used", stats.num_used), ("free", stats.num_free),
                         ("cached", stats.num_cached), ("shared", stats.num_shared)):
        blocks.add_metric([state], count)
    yield blocks
    yield GaugeMetricFamily("folio_kv_blocks_total", "KV cache blocks in the pool",
                            value=stats.num_blocks)
    yield GaugeMetricFamily("folio_kv_block_bytes", "Bytes of one KV block",
                            value=stats.bytes_per_block)
    yield GaugeMetricFamily("folio_prefix_cache_hit_rate", "Prompt tokens found in the "
                            "prefix cache / prompt tokens looked up, since start",
                            value=stats.hit_rate)
