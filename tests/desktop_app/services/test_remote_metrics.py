"""A remote server's /metrics page: Folio's, vLLM's and SGLang's names, or none."""

from __future__ import annotations

import urllib.request

from desktop_app.services.remote_metrics import (
    MetricsPoller,
    RemoteMetrics,
    metrics_url,
    parse_metrics,
)
from engine.serve.server import free_port
from tests.desktop_app.services.openai_stub import VLLM_METRICS, StubServer

SGLANG_METRICS = """\
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.125
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 3.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 0.0
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.75
"""

VLLM_V1_METRICS = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 200.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 50.0
"""


def test_metrics_url_is_at_the_root():
    assert metrics_url("http://gpu-box:8000/v1") == "http://gpu-box:8000/metrics"
    assert metrics_url("https://h/api/") == "https://h/api/metrics"


def test_folio_names(tiny_served):
    with urllib.request.urlopen(tiny_served.root + "/metrics", timeout=10) as response:
        text = response.read().decode()
    m = parse_metrics(text)
    assert m.flavor == "Folio" and m.blocks_total == 256
    assert m.blocks_used + m.blocks_free == 256
    assert m.usage == m.blocks_used / 256
    assert 0.0 <= m.hit_rate <= 1.0
    assert (m.running, m.waiting) == (0, 0)


def test_vllm_and_sglang_names():
    assert parse_metrics(VLLM_METRICS) == RemoteMetrics(
        "vLLM", usage=0.25, hit_rate=0.5, running=2, waiting=1)
    assert parse_metrics(VLLM_V1_METRICS) == RemoteMetrics(
        "vLLM", usage=0.5, hit_rate=0.25, running=1, waiting=0)
    assert parse_metrics(SGLANG_METRICS) == RemoteMetrics(
        "SGLang", usage=0.125, hit_rate=0.75, running=3, waiting=0)


def test_pages_without_kv_figures_give_none():
    assert parse_metrics("") is None
    assert parse_metrics("# TYPE process_cpu_seconds_total counter\n"
                         "process_cpu_seconds_total 1.5\n") is None
    assert parse_metrics("<html><body>Not here</body></html>") is None


def test_poller_says_why_there_are_no_figures():
    stub = StubServer(metrics=None)
    try:
        poller = MetricsPoller(metrics_url(stub.url))
        assert poller.latest() == (None, "", False)
        poller.poll_once()
        metrics, note, checked = poller.latest()
        assert metrics is None and checked
        assert note == (f"The server has no metrics page ({metrics_url(stub.url)} answered "
                        "404).")
        stub.metrics = VLLM_METRICS
        poller.poll_once()
        assert poller.latest()[0].flavor == "vLLM"
    finally:
        stub.stop()
    down = MetricsPoller(f"http://127.0.0.1:{free_port()}/metrics")
    down.poll_once()
    assert down.latest()[1].startswith("Could not read http://127.0.0.1:")
