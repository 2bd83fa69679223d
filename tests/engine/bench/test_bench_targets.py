"""The issue's targets table at the end of ``folio bench all``: met, not met and n/a rows,
picked from fabricated workload results (nothing is measured here)."""

from __future__ import annotations

from engine.bench.chat import recompute_target
from engine.bench.decode import llama_decode_target, llama_ttft_target
from engine.bench.eight_b import DECODE_TARGET, LOADS_TARGET
from engine.bench.memory import RSS_TARGET, WEIGHTS_TARGET
from engine.bench.moe import moe_target
from engine.bench.setup import Target
from engine.bench.structured import (
    CACHED_TARGET,
    FIRST_TARGET,
    MASK_TARGET,
    ROUND_TRIP_TARGET,
)
from engine.bench.targets import (
    ISSUE_TARGETS,
    LLAMA_MISSING,
    SIZE_TARGETS,
    format_targets,
    targets_table,
)


def _result(*targets: Target) -> dict:
    return {"targets": [t.as_dict() for t in targets], "notes": []}


def _by_label(rows: list[dict]) -> dict[str, dict]:
    return {row["target"]: row for row in rows}


def test_every_issue_row_is_reported_met_or_not_met():
    results = {
        "decode": _result(Target(llama_decode_target(128), 1.1, 1.0, ">="),
                          Target(llama_decode_target(2048), 0.7, 1.0, ">="),
                          Target(llama_ttft_target(2048), 0.4, 0.5, "<=")),
        "memory": _result(Target(RSS_TARGET, 2.5, 2.0, "<="),
                          Target(WEIGHTS_TARGET, 1.05, 1.1, "<=")),
        "8b": _result(Target(LOADS_TARGET, 1.0, 1.0, ">="), Target(DECODE_TARGET, 0.5, 0.8,
                                                                   ">=")),
        "candidates": _result(Target("Folio n=4 wall / n=1 wall", 1.39, 1.4, "<=")),
        "chat": _result(Target(recompute_target(8), 9.0, 10.0, ">=")),
        "sizes": _result(*(Target(spec.name, 1.0, 1.1, ">=") for spec in SIZE_TARGETS)),
        "structured": _result(Target(MASK_TARGET, 0.95, 0.9, ">="),
                              Target(FIRST_TARGET, 250.0, 200.0, "<="),
                              Target(CACHED_TARGET, 0.1, 5.0, "<="),
                              Target(ROUND_TRIP_TARGET, 0.94, 0.9, ">=")),
        "moe": _result(Target(moe_target("decode_tok_s"), 1.2, 1.0, ">="),
                       Target(moe_target("ttft_s"), 1.3, 1.0, "<="),
                       Target(moe_target("peak_rss_bytes"), 1.0, 1.1, "<=")),
    }
    rows = targets_table(results, llama_installed=True)
    assert len(rows) == len(ISSUE_TARGETS) == 9 + 4 + 3 + len(SIZE_TARGETS)
    assert [row["status"] for row in rows] == ["met", "not met", "met", "not met", "met",
                                               "met", "not met", "met", "not met",
                                               "met", "not met", "met", "met",
                                               "met", "not met", "met"] + [
        "not met"] * len(SIZE_TARGETS)
    assert rows[0]["value"] == "1.1" and rows[0]["want"] == ">= 1"
    assert rows[3]["want"] == "<= 2"
    assert rows[5]["value"] == "loads"
    text = format_targets(rows)
    assert text.splitlines()[0] == "== targets (this run) =="
    assert len(text.splitlines()) == 2 + len(rows)


def test_rows_without_a_figure_say_why():
    # decode ran without llama.cpp (no llama targets), memory measured only the weights,
    # 8b did not load, candidates did not run.
    results = {
        "decode": _result(Target("Folio tok/s at context 128", 20.0, 20.0, ">=")),
        "memory": _result(Target(WEIGHTS_TARGET, 1.3, 1.1, "<=")),
        "8b": _result(Target(LOADS_TARGET, 0.0, 1.0, ">=")),
    }
    rows = _by_label(targets_table(results, llama_installed=False))
    assert rows["decode tok/s at context 128, Folio / llama.cpp"]["status"] == LLAMA_MISSING
    assert rows["TTFT of a 2,048-token prompt, Folio / llama.cpp"]["status"] == LLAMA_MISSING
    peak = "peak RSS after one chat, 8,192-token context, Folio / llama.cpp"
    assert rows[peak]["status"] == LLAMA_MISSING
    assert rows["resident weight bytes / GGUF tensor bytes"]["status"] == "not met"
    loads = rows["synthetic 8B Q4_K_M loads on this machine"]
    assert (loads["value"], loads["status"]) == ("does not load", "not met")
    assert rows["synthetic 8B Q4_K_M decode, Folio / llama.cpp"]["status"] == LLAMA_MISSING
    candidates = rows["candidates n=4 wall / n=1 wall (512-token prompt, 64 tokens)"]
    assert candidates["status"] == "n/a: candidates did not run"
    assert rows["chat turn-8 TTFT, transformers recomputing / Folio"]["status"] == (
        "n/a: chat did not run")
    # llama.cpp installed but its figure missing (it failed, the model is a folder):
    rows = _by_label(targets_table(results, llama_installed=True))
    assert rows[peak]["status"].startswith("n/a: not measured")


def test_all_ends_with_the_table_and_writes_it_to_json(monkeypatch, tmp_path, capsys):
    import json

    from engine.bench import cli

    def fake(name: str):
        targets = [Target("Folio n=4 wall / n=1 wall", 1.2, 1.4, "<=")] if (
            name == "candidates") else []
        return lambda ctx: {"workload": name, "setup": {"model": "none"}, "rows": [],
                            "summary": {}, "targets": [t.as_dict() for t in targets],
                            "notes": []}

    for name in cli.WORKLOAD_NAMES:
        monkeypatch.setitem(cli.WORKLOADS, name, fake(name))
    monkeypatch.setattr(cli, "llama_cpp_installed", lambda: False)
    out = tmp_path / "bench.json"
    assert cli.main(["all", "--threads", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.rstrip().splitlines()[-len(ISSUE_TARGETS) - 2] == "== targets (this run) =="
    saved = json.loads(out.read_text())
    assert set(saved) == {*cli.WORKLOAD_NAMES, "issue_targets"}
    assert {"memory", "8b", "sizes"} <= set(cli.WORKLOAD_NAMES)
    statuses = [row["status"] for row in saved["issue_targets"]]
    assert statuses[7] == "met" and statuses[0] == LLAMA_MISSING
    assert statuses[4] == "n/a: not measured (see the workload's notes)"
    assert statuses[-len(SIZE_TARGETS):] == [LLAMA_MISSING] * len(SIZE_TARGETS)
