"""``/metrics`` of a server hosting several models (models.py's HostedModels): each
model's state, memory, idle time and KV blocks labelled by model, and the KV figures of
a one-model server (``folio_kv_blocks{state}``, ``folio_kv_blocks_total``,
``folio_prefix_cache_hit_rate``) summed over the loaded models, so a client that reads
those (the app's remote metrics) reads the whole server."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily

from engine.hosting import ModelHost

_STATES = ("used", "free", "cached", "shared")


def hosted_families(host: ModelHost, names: list[str]) -> Iterator[GaugeMetricFamily]:
    hosted = host.models()
    state = {m.name: m.state for m in hosted}
    loaded = GaugeMetricFamily("folio_model_loaded", "1 for a model loaded, 0.5 while it "
                               "loads, 0 for one in the library not loaded", labels=["model"])
    for name in names:
        loaded.add_metric([name], {"loaded": 1.0, "loading": 0.5}.get(state.get(name), 0.0))
    yield loaded
    memory = GaugeMetricFamily("folio_model_memory_bytes", "A hosted model's memory (the "
                               "estimate while it loads)", labels=["model", "part"])
    idle = GaugeMetricFamily("folio_model_idle_seconds", "Since a loaded model's last "
                             "request ended (absent while one runs)", labels=["model"])
    running = GaugeMetricFamily("folio_model_requests_running", "Requests holding a model",
                                labels=["model"])
    for m in hosted:
        for part, size in (("weights", m.weights_bytes), ("kv", m.kv_bytes),
                           ("total", m.total_bytes)):
            memory.add_metric([m.name, part], size)
        running.add_metric([m.name], m.running)
        if m.idle_s is not None:
            idle.add_metric([m.name], m.idle_s)
    yield from (memory, idle, running)
    yield GaugeMetricFamily("folio_memory_budget_bytes", "The hosted models' memory budget "
                            "(weights and KV pools; 0: none)", value=host.budget_bytes or 0)
    yield from _kv_families({name: w.kv_stats() for name, w in host.workers().items()})


def _kv_families(stats: dict) -> Iterator[GaugeMetricFamily]:
    per_model = GaugeMetricFamily("folio_model_kv_blocks", "A loaded model's KV cache "
                                  "blocks by state", labels=["model", "state"])
    block_bytes = GaugeMetricFamily("folio_model_kv_block_bytes", "Bytes of one of a "
                                    "model's KV blocks", labels=["model"])
    totals = dict.fromkeys(_STATES, 0)
    for name, kv in stats.items():
        for state in _STATES:
            count = getattr(kv, f"num_{state}")
            per_model.add_metric([name, state], count)
            totals[state] += count
        block_bytes.add_metric([name], kv.bytes_per_block)
    yield from (per_model, block_bytes)
    blocks = GaugeMetricFamily("folio_kv_blocks", "KV cache blocks by state, all loaded "
                               "models", labels=["state"])
    for state, count in totals.items():
        blocks.add_metric([state], count)
    yield blocks
    yield GaugeMetricFamily("folio_kv_blocks_total", "KV cache blocks in the loaded "
                            "models' pools", value=sum(kv.num_blocks for kv in stats.values()))
    hits = sum(kv.prefix_hit_tokens for kv in stats.values())
    queries = sum(kv.prefix_query_tokens for kv in stats.values())
    yield GaugeMetricFamily("folio_prefix_cache_hit_rate", "Prompt tokens found in the "
                            "prefix cache / prompt tokens looked up, loaded models since "
                            "they loaded", value=hits / queries if queries else 0.0)
