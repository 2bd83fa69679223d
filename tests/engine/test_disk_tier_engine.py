"""The KV cache's disk tier through the engine: a chat reopened after a restart finds its
history on disk and replies exactly as the app kept open, whether the first process
closed its engine (by hand, or leaving a ``with`` block) or just exited; damaged, foreign
or swapped files are recomputed with the same reply; a failing disk leaves the chat
working."""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest

from engine import LLM, EngineConfig, SamplingParams
from engine.disk import store as disk_store
from tests.cpu_pool import CPU_BLOCK_SIZE
from tests.engine.tiny_models import save_tiny_model, tiny_llama_config

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
ON = 1 << 30

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLIO_KV_CACHE_DIR", str(tmp_path / "kv"))
    return tmp_path / "kv"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="module")
def other_tiny(tmp_path_factory):
    config = tiny_llama_config(num_hidden_layers=2)
    return save_tiny_model(tmp_path_factory.mktemp("models") / "other-llama", config, seed=1)


def new_llm(model, **fields) -> LLM:
    fields = {"device": "cpu", "weights": "float32", "num_gpu_blocks": 64,
              "kv_disk_bytes": ON, **fields}
    return LLM(str(model), EngineConfig(**fields))


def chat(llm: LLM, turns: int, seed: int = 0) -> tuple[list[dict], list]:
    """``turns`` turns, each reply's ids spliced back; returns the messages and outputs."""
    rng = random.Random(seed)
    words = ["warm", "disk", "block", "cache", "chat", "turn", "token", "reply"]
    messages: list[dict] = []
    outs = []
    for _ in range(turns):
        messages.append({"role": "user", "content": " ".join(rng.choice(words)
                                                              for _ in range(12))})
        out = llm.chat(messages, GREEDY)
        outs.append(out)
        reply = out.outputs[0]
        messages.append({"role": "assistant", "content": reply.text,
                         "token_ids": reply.token_ids})
    return messages, outs


def next_turn(messages: list[dict]) -> list[dict]:
    return [*messages, {"role": "user", "content": "and once more from the disk"}]


def test_a_restart_finds_the_history_on_disk_and_replies_the_same(tiny, cache):
    first = new_llm(tiny)
    messages, _ = chat(first, 6)
    kept_open = first.chat(next_turn(messages), GREEDY)
    first.close()
    assert any(cache.rglob("*.kvb"))

    reopened = new_llm(tiny)
    out = reopened.chat(next_turn(messages), GREEDY)
    m, bs = out.metrics, reopened.engine.config.block_size
    full_blocks = (m.num_prompt_tokens - 1) // bs * bs
    assert m.num_disk_tokens == m.num_cached_tokens == full_blocks > 0
    assert out.outputs[0].token_ids == kept_open.outputs[0].token_ids
    stats = reopened.kv_stats(with_blocks=False).disk
    assert stats.hit_blocks == full_blocks // bs and stats.hit_tokens == full_blocks
    assert stats.skipped_files == 0


@pytest.mark.slow
def test_a_12_turn_starter_chat_reopens_from_disk(cache):
    """The issue's case: the 13th turn after a restart finds the first 12 turns on disk
    (all but the last partial block) and replies as the engine kept open."""
    first = new_llm("starter", num_gpu_blocks=None, max_model_len=2048)
    messages, _ = chat(first, 12)
    kept_open = first.chat(next_turn(messages), GREEDY)
    first.close()
    reopened = new_llm("starter", num_gpu_blocks=None, max_model_len=2048)
    out = reopened.chat(next_turn(messages), GREEDY)
    history = reopened.engine.encode(messages)  # the first 12 turns' ids
    bs = reopened.engine.config.block_size
    assert out.metrics.num_disk_tokens >= len(history) // bs * bs
    assert out.metrics.num_disk_tokens == (out.metrics.num_prompt_tokens - 1) // bs * bs
    assert out.outputs[0].token_ids == kept_open.outputs[0].token_ids


# A script that chats and exits without close(); prints the reply's tokens read from disk.
NEVER_CLOSED = textwrap.dedent("""
    import sys
    from engine import LLM, EngineConfig, SamplingParams
    llm = LLM(sys.argv[1], EngineConfig(device="cpu", weights="float32", num_gpu_blocks=64,
                                        kv_disk_bytes=1 << 30))
    messages = [{"role": "user", "content": "warm disk block cache chat turn " * 6}]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    print(llm.chat(messages, params).metrics.num_disk_tokens)
""")


def test_a_script_that_never_closes_keeps_its_blocks_at_exit(tiny, cache):
    def run() -> int:
        done = subprocess.run([sys.executable, "-c", NEVER_CLOSED, str(tiny)],
                              cwd=Path(__file__).resolve().parents[2],
                              env={**os.environ, "FOLIO_KV_CACHE_DIR": str(cache)},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.split()[-1])

    assert run() == 0 and any(cache.rglob("*.kvb"))
    assert run() > 0  # the second process reads the first one's blocks


def test_leaving_a_with_block_closes_the_engine(tiny, cache):
    with new_llm(tiny) as llm:
        messages, _ = chat(llm, 2)
        assert not any(cache.rglob("*.kvb"))
    assert any(cache.rglob("*.kvb"))
    out = new_llm(tiny).chat(next_turn(messages), GREEDY)
    assert out.metrics.num_disk_tokens > 0


def test_the_exit_hook_holds_no_engine(tiny, cache):
    llm = new_llm(tiny)
    chat(llm, 1)
    engine, tier = weakref.ref(llm.engine), weakref.ref(llm.engine.disk)
    del llm
    gc.collect()
    assert engine() is None and tier() is None


def test_evicted_blocks_go_to_disk_while_the_engine_runs(tiny, cache):
    llm = new_llm(tiny, num_gpu_blocks=320 // CPU_BLOCK_SIZE)  # 320 tokens, default blocks
    messages, _ = chat(llm, 2)
    # Other prompts fill the small pool: the chat's cached blocks are evicted to disk.
    for seed in range(4):
        llm.generate([[random.Random(seed).randrange(256) for _ in range(150)]], GREEDY)
    llm.engine.disk.flush()
    assert llm.kv_stats(with_blocks=False).disk.written_blocks > 0
    out = llm.chat(next_turn(messages), GREEDY)
    assert out.metrics.num_disk_tokens > 0


def _damage(cache, how: str, other_dir=None) -> int:
    files = sorted(cache.rglob("*.kvb"))
    if how == "flip":
        for f in files:
            data = bytearray(f.read_bytes())
            data[-5] ^= 0xFF
            f.write_bytes(bytes(data))
    elif how == "truncate":
        for f in files:
            f.write_bytes(f.read_bytes()[:-100])
    elif how == "swap":  # each file holds its neighbour's block
        contents = [f.read_bytes() for f in files]
        for f, data in zip(files, contents[1:] + contents[:1], strict=True):
            f.write_bytes(data)
    elif how == "foreign":  # another model's files under this model's names
        foreign = sorted(other_dir.rglob("*.kvb"))
        for f, data in zip(files, [g.read_bytes() for g in foreign], strict=False):
            f.write_bytes(data)
    return len(files)


@pytest.mark.parametrize("how", ["flip", "truncate", "swap", "foreign"])
def test_damaged_files_are_recomputed_with_the_same_reply(tiny, other_tiny, cache,
                                                          tmp_path, monkeypatch, how):
    other_dir = None
    if how == "foreign":
        monkeypatch.setenv("FOLIO_KV_CACHE_DIR", str(tmp_path / "other"))
        other = new_llm(other_tiny)
        chat(other, 6)  # at least as many files as the chat below: each one is replaced
        other.close()
        other_dir = tmp_path / "other"
        monkeypatch.setenv("FOLIO_KV_CACHE_DIR", str(cache))
    first = new_llm(tiny)
    messages, _ = chat(first, 3)
    kept_open = first.chat(next_turn(messages), GREEDY)
    first.close()
    assert _damage(cache, how, other_dir) > 0

    reopened = new_llm(tiny)
    out = reopened.chat(next_turn(messages), GREEDY)
    assert out.outputs[0].token_ids == kept_open.outputs[0].token_ids
    assert out.metrics.num_disk_tokens == 0
    assert reopened.kv_stats(with_blocks=False).disk.skipped_files >= 1


def test_a_failing_disk_keeps_the_chat_working(tiny, cache, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk_store.os, "replace", full)
    llm = new_llm(tiny, num_gpu_blocks=20)
    messages, outs = chat(llm, 3)
    llm.close()
    assert not llm.kv_stats(with_blocks=False).disk.enabled
    reference = new_llm(tiny, num_gpu_blocks=20, kv_disk_bytes=0)
    _, ref_outs = chat(reference, 3)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref_outs]
    assert reference.kv_stats(with_blocks=False).disk is None


def test_another_model_never_finds_these_blocks(tiny, other_tiny, cache):
    first = new_llm(tiny)
    messages, _ = chat(first, 2)
    first.close()
    other = new_llm(other_tiny)
    out = other.chat(next_turn(messages), GREEDY)
    assert out.metrics.num_disk_tokens == 0


def test_clear_removes_the_files(tiny, cache):
    llm = new_llm(tiny)
    chat(llm, 2)
    llm.close()
    assert any(cache.rglob("*.kvb"))
    llm.engine.clear_disk()
    assert not any(cache.rglob("*.kvb"))
    assert llm.kv_stats(with_blocks=False).disk.num_blocks == 0
