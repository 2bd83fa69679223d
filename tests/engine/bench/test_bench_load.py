"""``folio bench load``'s own arithmetic: each figure's best run, the rows' ratios and the
targets on total (import + load) time; llama.cpp itself is not run here."""

from __future__ import annotations

from engine.bench.load import BAR, best_of, load_rows, load_targets

RUNS = {
    "folio first": [{"import_s": 1.0, "load_s": 3.0, "total_s": 4.0},
                    {"import_s": 1.2, "load_s": 2.0, "total_s": 3.2}],
    "folio later": [{"import_s": 1.0, "load_s": 0.5, "total_s": 1.5}, {}],
    "llama.cpp": [{"import_s": 0.2, "load_s": 0.8, "total_s": 1.0},
                  {"import_s": 0.1, "load_s": 1.0, "total_s": 1.1}],
}


def test_each_figure_is_its_best_run_and_a_failed_run_counts_for_nothing():
    best = {side: best_of(runs) for side, runs in RUNS.items()}
    assert best["folio first"] == {"import_s": 1.0, "load_s": 2.0, "total_s": 3.2}
    assert best["folio later"] == {"import_s": 1.0, "load_s": 0.5, "total_s": 1.5}
    assert best_of([{}, {}]) == {}


def test_rows_and_targets_are_folio_over_llama_cpp_on_total_time():
    best = {side: best_of(runs) for side, runs in RUNS.items()}
    rows = {row["side"]: row for row in load_rows("1b", best)}
    assert rows["folio first"]["total / llama.cpp"] == 3.2
    assert rows["folio later"]["load / llama.cpp"] == round(0.5 / 0.8, 2)
    assert "total / llama.cpp" not in rows["llama.cpp"]
    first, later = load_targets("1b", best)
    assert (first.value, first.limit, first.met) == (3.2, BAR, False)
    assert (later.value, later.met) == (1.5, True)
    assert "later load" in later.name


def test_without_llama_cpp_there_is_no_target():
    best = {"folio first": {"total_s": 2.0, "load_s": 1.0}}
    assert load_targets("3b", best) == []
    assert load_rows("3b", best)[0]["total / llama.cpp"] is None
