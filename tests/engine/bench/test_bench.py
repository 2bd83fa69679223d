"""`folio bench`: every workload in a tiny configuration on a tiny random model, so the
bench cannot rot. These tests check what was measured (token counts, KV bytes, structure),
never how fast it was."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from engine.bench.baselines import Reply, mean_rate, median_rate
from engine.bench.candidates import bench_candidates
from engine.bench.chat import bench_chat
from engine.bench.cli import format_result, format_table, main, run
from engine.bench.concurrent import bench_concurrent
from engine.bench.decode import bench_decode
from engine.bench.scheduler import bench_scheduler
from engine.bench.setup import BenchContext, BenchSettings, Target, filler_prompt, user_messages
from engine.bench.waste import bench_waste
from tests.cpu_pool import CPU_BLOCK_SIZE, cpu_kv_bytes_per_token
from tests.engine.tiny_models import save_tiny_model

BLOCK = CPU_BLOCK_SIZE  # the benches run the engine's default pool
# tiny_llama_config: 2 layers x (K, V) x 2 KV heads x head size 16.
KV_BYTES_PER_TOKEN = cpu_kv_bytes_per_token(2, 2, 16)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="module")
def ctx(tiny_dir):
    threads = torch.get_num_threads()
    settings = BenchSettings(
        model=str(tiny_dir), threads=1, turns=2, chat_repeats=2, user_tokens=12, reply_tokens=6,
        candidate_prompt_tokens=3 * BLOCK, candidate_tokens=6, candidate_ns=(1, 2, 4),
        decode_contexts=(16, 128), decode_tokens=5, decode_rounds=2, concurrent_chats=3,
        serve_clients=4, serve_turns=3, kv_blocks=256, structured_rounds=2,
        structured_tokens=8,
    )
    yield BenchContext.create(settings)
    torch.set_num_threads(threads)


def _targets(result: dict) -> list[str]:
    for target in result["targets"]:
        assert target["met"] == (target["value"] <= target["limit"] if target["op"] == "<="
                                 else target["value"] >= target["limit"])
    return [target["name"] for target in result["targets"]]


def test_chat_counts_what_each_side_computes(ctx):
    result = bench_chat(ctx)
    assert result["workload"] == "chat"
    assert result["summary"]["folio_chat_runs"] == 2
    first, second = result["rows"]
    assert (first["turn"], second["turn"]) == (1, 2)
    p1, p2 = first["prompt_tokens"], second["prompt_tokens"]
    # Turn 1: nothing is cached anywhere, every side computes the whole prompt.
    assert first["folio_computed"] == first["hf_recompute_computed"] == p1
    assert first["hf_cache_computed"] == p1
    # Turn 2: recompute runs the whole history; the DynamicCache holds turn 1 but the last
    # reply token, and so does Folio's prefix cache (turn 1's full blocks, and its partial
    # last block copied).
    assert p2 > p1 + 6 and (p1 + 6 - 1) % BLOCK
    assert second["hf_recompute_computed"] == p2
    assert second["hf_cache_computed"] == p2 - (p1 + 6 - 1)
    assert second["folio_computed"] == p2 - (p1 + 6 - 1)
    assert second["folio_computed"] < second["hf_recompute_computed"]
    assert all(row[f"{side}_ttft_ms"] > 0 for row in result["rows"]
               for side in ("folio", "hf_recompute", "hf_cache"))
    assert set(result["summary"]["same_replies_as_folio"]) == {"hf_recompute", "hf_cache"}
    assert _targets(result) == ["Folio turn-2 TTFT / turn-1 TTFT",
                                "transformers-recompute / Folio TTFT at turn 2",
                                "Folio computed prompt tokens / new tokens, turns 2-2"]
    new = p2 - p1 - 6
    assert result["targets"][2]["value"] == round(second["folio_computed"] / new, 3)
    assert "snapshot_every_blocks" not in result["summary"]  # no linear layers
    if importlib.util.find_spec("llama_cpp") is None:
        assert result["notes"] == ["llama.cpp skipped: llama_cpp is not installed "
                                   "(pip install -e '.[bench]')"]
    else:  # a model folder is no GGUF file
        assert result["notes"] == ["llama.cpp skipped: it needs a .gguf file, the model is "
                                   "a folder"]


def test_candidates_share_the_prompt_blocks(ctx):
    result = bench_candidates(ctx)
    rows = result["rows"]
    assert [row["n"] for row in rows] == [1, 2, 4]
    per_block = BLOCK * KV_BYTES_PER_TOKEN
    # 3 full blocks of prompt + 6 new tokens, the last never written: 4 blocks.
    assert rows[0]["folio_kv_bytes"] == 4 * per_block
    # n candidates share the 3 prompt blocks and write one block each.
    assert [row["folio_kv_bytes"] for row in rows] == [(3 + n) * per_block for n in (1, 2, 4)]
    assert [row["hf_kv_bytes"] for row in rows] == [n * (3 * BLOCK + 6) * KV_BYTES_PER_TOKEN
                                                    for n in (1, 2, 4)]
    assert [row["separate_copies_kv_bytes"] for row in rows] == [n * 4 * per_block
                                                                 for n in (1, 2, 4)]
    # A new tag per run: no block of an earlier run's prompt is found, only the first
    # tokens before the tag (engine/core/partial_blocks.py).
    assert all(row["folio_cached_prompt_tokens"] < BLOCK for row in rows)
    assert result["targets"][1]["value"] == round(7 / 16, 3)
    assert _targets(result) == ["Folio n=4 wall / n=1 wall",
                                "Folio n=4 KV / four separate copies"]


def test_decode_reports_each_context(ctx):
    result = bench_decode(ctx)
    assert [row["context"] for row in result["rows"]] == [16, 128]
    assert result["summary"]["rounds"] == 2
    assert all(row["folio_tok_s"] > 0 and row["hf_tok_s"] > 0 for row in result["rows"])
    assert _targets(result) == ["Folio / transformers tok/s at context 16",
                                "Folio / transformers tok/s at context 128",
                                "Folio tok/s at context 128"]


def test_concurrent_chats_all_finish(ctx):
    result = bench_concurrent(ctx)
    rows = result["rows"]
    assert [row["chat"] for row in rows] == [1, 2, 3]
    assert result["summary"]["tokens"] == 3 * 6
    assert all(row["folio_ttft_ms"] > 0 for row in rows)
    # transformers answers one chat after another: each waits for the ones before it.
    hf = [row["hf_sequential_ttft_ms"] for row in rows]
    assert hf == sorted(hf) and len(set(hf)) == 3
    assert result["targets"] == []


def test_serve_runs_clients_at_once_and_a_chat_through_the_api(ctx):
    from engine.bench.serve import bench_serve

    result = bench_serve(ctx)
    alone, together, *turns = result["rows"]
    assert (alone["clients"], together["clients"]) == (1, 4)
    assert alone["total_tok_s"] > 0 and together["total_tok_s"] > 0
    assert [t["turn"] for t in turns] == [1, 2, 3]
    # Each turn sends the whole conversation: the earlier turns come from the cache, in
    # whole blocks.
    for before, turn in zip(turns, turns[1:], strict=False):
        assert turn["cached_tokens"] >= before["prompt_tokens"] // BLOCK * BLOCK
    assert [t["prompt_tokens"] for t in turns] == sorted(t["prompt_tokens"] for t in turns)
    assert _targets(result) == ["4 clients / 1 client total tokens/s",
                                "p95 TTFT with 4 clients (s)",
                                "API chat turn-3 TTFT / turn-1 TTFT"]


def test_structured_measures_the_mask_compiles_and_a_tool_round_trip(ctx):
    from engine.bench.structured import bench_structured

    result = bench_structured(ctx)
    masked, free, first, cached, trip = result["rows"]
    assert masked["tok_s"] > 0 and free["tok_s"] > 0
    assert first["ms"] > 0 and cached["ms"] >= 0
    assert 0 < trip["cached_tokens"] <= trip["first_tokens"]
    assert all(1 <= n <= 8 for n in result["summary"]["constrained_reply_tokens"])
    assert _targets(result) == [
        "decode tok/s with a JSON-schema mask / without",
        "mask compile ms, 20-field schema, first use", "mask compile ms, 20-field schema, cached",
        "tool round trip cached tokens / first request's prompt + reply"]


def test_waste_is_sampled_on_every_step_with_blocks(ctx):
    result = bench_waste(ctx)
    summary = result["summary"]
    # Per turn: one prefill step and 5 decode steps; the last one frees the blocks.
    assert summary["samples"] == len(summary["waste_series"]) == 2 * (6 - 1)
    assert all(0 <= w < 1 for w in summary["waste_series"])
    assert summary["max_waste_pct"] == round(100 * max(summary["waste_series"]), 2)
    assert _targets(result) == ["mean KV waste (%)"]


def test_reopen_finds_the_history_on_disk_after_a_restart(tiny_dir):
    from engine.bench.reopen import bench_reopen

    settings = BenchSettings(model=str(tiny_dir), threads=1, reply_tokens=4, kv_blocks=256,
                             reopen_tokens=240, reopen_repeats=1, reopen_sizes=())
    threads = torch.get_num_threads()
    try:
        result = bench_reopen(BenchContext.create(settings))
    finally:
        torch.set_num_threads(threads)
    [row] = result["rows"]
    assert row["same_reply"] and row["block_files"] > 0
    # Every full block of the history (up to where the new message starts) from disk.
    history = row["history_tokens"] // BLOCK * BLOCK
    assert row["restart_disk_tokens"] == row["restart_cached_tokens"] == history > 0
    # Opened first: the history was loaded ahead, found in memory, still from disk.
    assert row["opened_cached_tokens"] == row["opened_disk_tokens"] == history
    # Each file's header over a tiny model's block: a few percent.
    assert row["disk_over_kv_bytes"] <= 1.1
    # The running request took its steps while the other's history was read.
    assert row["decode_steps_while_loading"] >= 1 and row["decode_while_loading_over_alone"] > 0
    name = str(tiny_dir)
    assert _targets(result) == [
        f"{name}: restart (opened, then sent) / kept-open TTFT of turn 13",
        f"{name}: restart / recompute TTFT of turn 13",
        f"{name}: decode tok/s while another request's blocks load / alone",
        "decode tok/s while writing blocks / tier off", "disk bytes / KV bytes per block"]


def test_scheduler_workload():
    result = bench_scheduler(num_seqs=4, prompt_len=20, steps=10)
    assert result["rows"][0]["running_seqs"] == 4 and result["rows"][0]["steps"] == 10
    assert _targets(result) == ["scheduler step (ms)"]


def test_cli_writes_json_and_says_when_charts_are_skipped(tiny_dir, tmp_path, capsys):
    threads = torch.get_num_threads()
    out = tmp_path / "bench.json"
    code = main(["chat", "--model", str(tiny_dir), "--turns", "2", "--threads", "1",
                 "--kv-blocks", "128", "--json", str(out), "--plot", str(tmp_path / "png")])
    assert code == 0
    assert torch.get_num_threads() == threads  # restored after the run
    saved = json.loads(out.read_text())
    assert list(saved) == ["chat"] and len(saved["chat"]["rows"]) == 2
    text = capsys.readouterr().out
    assert "== chat (" in text and "target: Folio turn-2 TTFT / turn-1 TTFT = " in text
    if importlib.util.find_spec("matplotlib") is None:
        assert "charts skipped: matplotlib is not installed" in text
    else:
        assert (tmp_path / "png" / "chat.png").stat().st_size > 0


def test_charts_for_every_workload(ctx, tmp_path):
    pytest.importorskip("matplotlib")
    from engine.bench.plot import plot_results

    results = run(["chat", "waste"], ctx.settings)
    written = plot_results(results, tmp_path)
    assert [p.name for p in written] == ["chat.png", "waste.png"]


def test_bad_settings_name_the_field(tiny_dir):
    with pytest.raises(ValueError, match="turns"):
        BenchSettings(turns=0)
    with pytest.raises(ValueError, match="threads"):
        BenchSettings(threads=0)
    with pytest.raises(ValueError, match="candidate_tokens must be >= 2"):
        BenchSettings(candidate_tokens=1)
    with pytest.raises(ValueError, match="candidate_ns"):
        BenchSettings(candidate_ns=(1, 0))
    with pytest.raises(ValueError, match="candidate_runs must be an integer >= 1"):
        BenchSettings(candidate_runs=0)
    with pytest.raises(ValueError, match="workload"):
        run(["nope"], BenchSettings(model=str(tiny_dir)))
    with pytest.raises(SystemExit):
        main(["chat", "--turns", "0"])


def test_inputs_are_deterministic(ctx):
    from engine.text.chat_template import ChatTokenizer
    from tests.engine.tiny_models import byte_level_tokenizer

    tok = ChatTokenizer(byte_level_tokenizer())
    texts = user_messages(tok, 10, 12)
    assert len(texts) == 10 and len(set(texts)) == 10
    assert all(len(tok.encode(t, add_special_tokens=False)) == 12 for t in texts)
    assert texts[8].startswith("Turn 9: ")
    prompt = filler_prompt(tok, 700, "Run 1")
    assert len(prompt) == 700 and prompt == filler_prompt(tok, 700, "Run 1")
    assert prompt[:5] != filler_prompt(tok, 700, "Run 2")[:5]


def test_rates_and_formatting():
    assert median_rate([0.0, 0.1, 0.3, 0.4]) == pytest.approx(10.0)
    # Runs are pooled gap by gap; the pause between two runs is no gap.
    assert median_rate([0.0, 0.1], [5.0, 5.3, 5.4]) == pytest.approx(10.0)
    assert mean_rate([0.0, 0.1, 0.3, 0.4]) == pytest.approx(7.5)
    assert Reply([1, 2], 0.1, 3, 3, [1.0, 1.5]).median_tok_s == pytest.approx(2.0)
    assert format_table([{"n": 1, "kv_bytes": 1234567}, {"n": 8, "x": 0.5}]) == (
        "n   kv_bytes    x\n"
        "1  1,234,567     \n"
        "8             0.5"
    )
    result = {"workload": "w", "setup": {"model": "none"}, "rows": [{"a": 1}],
              "summary": {"k": 2, "series": [1, 2]},
              "targets": [Target("t", 2.0, 1.0, "<=").as_dict()], "notes": ["n"]}
    assert format_result(result) == (
        "== w ==\na\n1\nk: 2\ntarget: t = 2 (want <= 1): NOT met\nnote: n"
    )
