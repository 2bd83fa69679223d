"""Two tiny models of different families (Llama, Qwen2) in one ModelHost, running at
once: each one's greedy replies are those of an engine of its own, their KV pools are
separate tensors, and one's preemption (its small pool overflowing) leaves the other be."""

from __future__ import annotations

import threading
from itertools import pairwise

import pytest
from transformers import Qwen2Config

from engine import LLM
from engine.config import EngineConfig
from engine.hosting import ModelHost
from engine.outputs import ErrorEvent, FinishedEvent
from engine.sampling_params import SamplingParams
from tests.engine.tiny_models import random_prompt, save_tiny_model, tiny_llama_config

GREEDY = SamplingParams(max_tokens=80, temperature=0, ignore_eos=True)
# Six growing requests overflow 24 blocks of 16 tokens; two do not.
CONFIG = EngineConfig(num_gpu_blocks=24, kv_cache_dtype="float32", max_model_len=512)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    base = tiny_llama_config()
    qwen = Qwen2Config(vocab_size=base.vocab_size, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=1024, rope_theta=1000000.0,
                       tie_word_embeddings=True, bos_token_id=256, eos_token_id=258)
    return {"llama": str(save_tiny_model(root / "llama", base, seed=1)),
            "qwen2": str(save_tiny_model(root / "qwen2", qwen, seed=2))}


PROMPTS = {"llama": [random_prompt(i, 20 + i) for i in range(6)],
           "qwen2": [random_prompt(10 + i, 18) for i in range(2)]}


def run_on(worker, prompts) -> list[list[int]]:
    """Submit every prompt at once; the greedy tokens of each, in order."""
    done, outputs, errors = threading.Semaphore(0), {}, []

    def on_event(event):
        if isinstance(event, FinishedEvent):
            outputs[event.request_id] = list(event.output.outputs[0].token_ids)
            done.release()
        elif isinstance(event, ErrorEvent):
            errors.append(event.message)
            done.release()

    ids = [worker.submit(p, GREEDY, on_event).request_id for p in prompts]
    for _ in prompts:
        assert done.acquire(timeout=120)
    assert errors == []
    return [outputs[i] for i in ids]


def test_two_families_in_one_host_match_their_own_engines(folders):
    expected = {family: [o.outputs[0].token_ids for o in
                         LLM(path, CONFIG).generate(PROMPTS[family], GREEDY)]
                for family, path in folders.items()}
    host = ModelHost(CONFIG, None)
    try:
        leases = {family: host.lease(path) for family, path in folders.items()}
        got: dict[str, list] = {}
        threads = [threading.Thread(target=lambda f=family: got.__setitem__(
            f, run_on(leases[f].worker, PROMPTS[f]))) for family in folders]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert got == expected

        engines = {f: lease.worker.llm.engine for f, lease in leases.items()}
        assert engines["llama"].scheduler.num_preemptions > 0
        assert engines["qwen2"].scheduler.num_preemptions == 0
        spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                 for engine in engines.values() for t in engine.runner.kv_caches]
        spans.sort()
        assert all(end <= start for (_, end), (start, _) in pairwise(spans))
        for family, lease in leases.items():
            (model,) = [m for m in host.models() if m.name == folders[family]]
            stats = lease.worker.memory_stats()
            assert model.kv_bytes == stats.kv_pool_bytes > 0
            assert model.weights_bytes == stats.weights_bytes > 0
            lease.release()
    finally:
        host.shutdown()


def test_the_default_estimate_refuses_a_model_over_the_budget_before_loading(folders):
    host = ModelHost(CONFIG, 64 * 1024)
    with pytest.raises(Exception, match="more than the whole memory budget") as info:
        host.lease(folders["llama"])
    assert type(info.value).__name__ == "ModelWontFit"
    assert host.models() == []
