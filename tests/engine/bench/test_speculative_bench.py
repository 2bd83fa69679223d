"""``folio bench speculative``: its table's met / not met / n/a logic on made-up figures,
and the whole workload in its quick plan on a tiny synthetic shape (llama.cpp off).
Nothing here checks how fast anything was."""

from __future__ import annotations

import pytest
import torch

from engine.bench import kv as kv_bench
from engine.bench import synthetic
from engine.bench.cli import WORKLOADS, format_result
from engine.bench.setup import BenchContext, BenchSettings
from engine.bench.speculative import QUICK, SpecPlan, bench_speculative
from engine.bench.speculative_table import SpecFigures, spec_table

# Context long enough for the code-edit prompt (~250 ids) and the quick plan's reply.
TINY = synthetic.Shape(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64,
                       intermediate=512, context=512)
CODE = "starter code-edit chat"


def _run(rates: list[float], ids: list[int], drafted: int = 0, accepted: int = 0) -> dict:
    return {"tok_s": rates, "ids": ids, "drafted": drafted, "accepted": accepted}


def _figures() -> SpecFigures:
    plain = list(range(20))
    fig = SpecFigures()
    fig.runs = {
        "folio": {
            "code/plain": _run([60.0, 62.0], plain),
            "code/ngram": _run([70.0, 68.0], plain, drafted=40, accepted=10),
            "code/exact": _run([190.0], plain, drafted=19, accepted=19),
            "code/code": _run([80.0], plain[:5] + [99] * 15, drafted=30, accepted=6),
            "code/exact_k4": _run([150.0], plain, drafted=19, accepted=19),
            "code/self_k4": _run([40.0], plain, drafted=19, accepted=19),
            "prose/plain": _run([64.0], plain),
            "prose/ngram": _run([61.0], plain),  # 0.953: slower than the bar allows
        },
        "llama plain": {"code/plain": _run([58.0], plain), "prose/plain": _run([59.0], plain)},
        "llama lookup": {"code/lookup": _run([31.0], plain[:3]),
                         "prose/lookup": _run([30.0], plain)},
        "folio 1b": {"code/plain": _run([10.0], plain),
                     "code/exact": _run([31.0], plain, 19, 14),
                     "code/ngram": _run([11.0], plain)},
    }
    fig.why = {"folio 3b": "3b not run (--sizes)"}
    return fig


def test_every_target_has_a_row_and_its_verdict():
    rows, targets = spec_table(_figures(), ("1b", "3b"))
    status = {row["figure"]: row["status"] for row in rows}
    measured = {row["figure"]: row["measured"] for row in rows}
    assert status[f"{CODE}, decode Folio ngram / Folio plain"] == "met"  # 70 / 62
    assert "drafts 25% kept (10 of 40)" in measured[f"{CODE}, decode Folio ngram / Folio plain"]
    assert "same tokens as plain" in measured[f"{CODE}, decode Folio ngram / Folio plain"]
    assert status[f"{CODE}, Folio ngram / llama.cpp prompt lookup"] == "met"  # 70 / 31
    assert status[f"{CODE}, Folio plain / llama.cpp plain"] == "reported"
    lookup = f"{CODE}, llama.cpp prompt lookup / llama.cpp plain"
    assert "tokens differ from plain from token 3 on" in measured[lookup]
    assert status["starter free-prose chat, decode Folio ngram / Folio plain"] == "not met"
    exact = f"{CODE}, Predicted Outputs (the plain reply as prediction) / plain"
    assert status[exact] == "met"  # 190 / 62 = 3.06
    shape = "{} shape code-edit chat (random weights), Predicted Outputs (its plain reply's " \
            "ids as prediction, float32 KV pool) / plain"
    assert status[shape.format("1B")] == "met"  # 31 / 10
    assert "drafts 74% kept (14 of 19)" in measured[shape.format("1B")]
    assert status[shape.format("3B")] == "n/a: 3b not run (--sizes)"
    code = f"{CODE}, Predicted Outputs (the prompt's code as prediction) / plain"
    assert status[code] == "reported"
    assert "tokens differ from plain from token 5 on" in measured[code]
    own = f"{CODE}, the model drafting for itself (draft: the same file), k = 4 / plain"
    assert status[own] == "reported"
    assert measured[own].startswith("40.0 / 62.0 tok/s; drafts 100% kept (19 of 19)")
    by_name = {t.name: t for t in targets}
    assert len(by_name) == 5  # ngram, llama.cpp, prose, exact on the model and the 1B shape
    assert by_name[exact].value == pytest.approx(190 / 62, abs=1e-4)
    assert {row["want"] for row in rows if row["status"] == "reported"} == {""}


def test_llama_cpp_missing_leaves_its_rows_na_with_why():
    fig = _figures()
    for side in ("llama plain", "llama lookup"):
        fig.runs.pop(side)
        fig.why[side] = "llama.cpp skipped: test"
    rows, targets = spec_table(fig, ("1b",))
    status = {row["figure"]: row["status"] for row in rows}
    assert status[f"{CODE}, Folio ngram / llama.cpp prompt lookup"] == \
        "n/a: llama.cpp skipped: test"
    assert status[f"{CODE}, Folio plain / llama.cpp plain"] == "n/a: llama.cpp skipped: test"
    assert len(targets) == 4
    assert not any("3B" in row["figure"] for row in rows)


def test_the_plan_checks_its_sizes():
    with pytest.raises(ValueError, match="SpecPlan.max_tokens"):
        SpecPlan(max_tokens=1)
    with pytest.raises(ValueError, match="SpecPlan.runs"):
        SpecPlan(runs=0)
    with pytest.raises(ValueError, match="unknown size"):
        SpecPlan(shapes=("2b",))
    assert "speculative" in WORKLOADS


def test_the_quick_plan_end_to_end_on_a_tiny_shape(tmp_path, monkeypatch):
    from engine.loaders.catalog import starter_path

    threads = torch.get_num_threads()
    tiny, _ = synthetic.ensure_synthetic_gguf(starter_path(), TINY, root=tmp_path / "model")
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(synthetic.SIZES, "1b", TINY)  # the sides find it under the cache
    monkeypatch.setattr(kv_bench, "llama_python", lambda: (None, "llama.cpp skipped: test"))
    ctx = BenchContext.create(BenchSettings(model=str(tiny), threads=1, sizes=("1b",)))
    try:
        result = bench_speculative(ctx, QUICK)
    finally:
        torch.set_num_threads(threads)
    assert result["workload"] == "speculative" and result["summary"]["cpu"]
    status = {row["figure"]: row["status"] for row in result["rows"]}
    name = tiny.stem
    assert status[f"{name} code-edit chat, decode Folio ngram / Folio plain"] in (
        "met", "not met")
    assert status[f"{name} code-edit chat, Folio ngram / llama.cpp prompt lookup"] == \
        "n/a: llama.cpp skipped: test"
    shape = ("1B shape code-edit chat (random weights), Predicted Outputs (its plain reply's "
             "ids as prediction, float32 KV pool) / plain")
    assert status[shape] in ("met", "not met")
    assert status[shape.replace("1B", "3B")] == "n/a: 3b not run (--sizes)"
    runs = result["figures"]["runs"]
    # The 1B shape ignores its end token: its whole quick reply, every draft of the exact
    # prediction checked.
    assert len(runs["folio 1b"]["code/exact"]["ids"]) == QUICK.max_tokens
    assert runs["folio 1b"]["code/exact"]["drafted"] > 0
    assert runs["folio"]["code/plain"]["tok_s"][0] > 0
    assert runs["folio"]["code/self_k4"]["ids"] and "code/self_k4" not in runs["folio 1b"]
    # Its prediction is its plain reply's ids: every draft kept, the reply unchanged.
    exact = runs["folio 1b"]["code/exact"]
    assert exact["accepted"] == exact["drafted"]
    assert exact["ids"] == runs["folio 1b"]["code/plain"]["ids"]
    assert "text_ids" not in runs["folio 1b"]["code/plain"]
    agree, total = runs["folio"]["code/plain"]["text_ids"]
    assert 0 <= agree <= total
    assert "llama.cpp skipped: test" in result["notes"]
    text = format_result(result)
    assert "cpu: " in text and "status" in text
