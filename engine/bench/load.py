"""``folio bench load``: how long a model takes to load in a fresh process, import
included, Folio next to llama.cpp, on the synthetic Llama-3.2-1B- and 3B-shaped Q4_K_M files
(``synthetic.SIZES``, the ``--sizes`` among 1b and 3b).

Per size, each run starts a fresh interpreter per side, the file freshly in the page cache
(``sizes._recache``), and times from the child's first statement: ``import_s`` (torch and
the engine, or llama_cpp), ``load_s`` (``LLM(path)``, or ``Llama(model_path=...)``, to
ready) and their sum ``total_s``. Folio's child starts as ``folio chat`` does: the cyclic
collector paused until the model has loaded (engine/startup.py), its one pass after that
counted in ``load_s``. Folio runs twice per run on a conversion cache of its own:
``first`` (an empty cache: the file's tokenizer built from its keys, its config too, and
the entry written) and ``later`` (read from that entry). Each figure is the side's best
of ``sizes_runs`` runs (a shared machine). The targets are Folio / llama.cpp on
``total_s`` (the issue's "load in a fresh process, import included"), first and later
loads, at most 1.5.

llama.cpp runs under the interpreter ``FOLIO_BENCH_LLAMA_PYTHON`` names (one with
llama-cpp-python installed), else this one; it is skipped, with a note, when that one
cannot import llama_cpp.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.bench.probe import parse_reports

LOAD_SIZES = ("1b", "3b")
BAR = 1.5
PHASES = ("first", "later")
_LLAMA_PYTHON = "FOLIO_BENCH_LLAMA_PYTHON"

# Started as `folio chat`, `folio serve` and the app start (engine/startup.py): the cyclic
# collector paused from the imports to the loaded model, the imports frozen, the one pass
# over what the load made counted in load_s.
_FOLIO_CHILD = """
import time
start = time.perf_counter()
import sys, json
from engine.startup import freeze_imports, pause_collection, resume_collection
pause_collection()
import torch
from engine.bench.setup import folio_config
from engine.llm import LLM
freeze_imports()
torch.set_num_threads(int(sys.argv[2]))
loading = time.perf_counter()
llm = LLM(sys.argv[1], folio_config(int(sys.argv[2]), "stored", max_model_len=1024,
                                    block_size=16, num_gpu_blocks=64))
resume_collection()
done = time.perf_counter()
print("@@folio-probe@@ " + json.dumps({"import_s": loading - start, "load_s": done - loading}))
"""

_LLAMA_CHILD = """
import time
start = time.perf_counter()
import sys, json
import llama_cpp
loading = time.perf_counter()
llama = llama_cpp.Llama(model_path=sys.argv[1], n_threads=int(sys.argv[2]), n_ctx=1024,
                        verbose=False)
done = time.perf_counter()
print("@@folio-probe@@ " + json.dumps({"import_s": loading - start, "load_s": done - loading}))
"""


def bench_load(ctx) -> dict:
    from engine.bench import synthetic
    from engine.bench.common import bench_result
    from engine.loaders.catalog import starter_path

    s = ctx.settings
    sizes = [size for size in s.sizes if size in LOAD_SIZES] or list(LOAD_SIZES)
    rows, targets = [], []
    notes = [f"each figure is the best of {s.sizes_runs} fresh-process runs per side",
             "total = import + load, timed from the child's first statement"]
    llama_python = os.environ.get(_LLAMA_PYTHON) or sys.executable
    llama_note = _llama_status(llama_python)
    if llama_note:
        notes.append(llama_note)
    summary: dict = {"sizes": sizes, "runs": s.sizes_runs, "threads": ctx.threads}
    for size in sizes:
        path, _ = synthetic.ensure_synthetic_gguf(starter_path(), synthetic.SIZES[size])
        runs = run_sides(path, ctx.threads, s.sizes_runs, llama_python if not llama_note
                         else None, notes, size)
        best = {key: best_of(got) for key, got in runs.items()}
        rows += load_rows(size, best)
        targets += load_targets(size, best)
        summary[size] = {"file": str(path), "each_run": runs}
    result = bench_result("load", ctx, rows, summary, targets, notes)
    result["setup"]["model"] = f"synthetic Q4_K_M {','.join(sizes)}"
    return result


def run_sides(path: Path, threads: int, runs: int, llama_python: str | None,
              notes: list[str], label: str) -> dict[str, list[dict]]:
    """Each side's runs: {"folio first": [...], "folio later": [...], "llama.cpp": [...]}."""
    from engine.bench.sizes import _recache

    got: dict[str, list[dict]] = {"folio first": [], "folio later": []}
    if llama_python:
        got["llama.cpp"] = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="folio-load-bench-") as cache:
            env = dict(os.environ, FOLIO_CACHE_DIR=cache)
            for phase in PHASES:
                _recache(path)
                got[f"folio {phase}"].append(
                    _child(sys.executable, _FOLIO_CHILD, path, threads, env, notes, label))
        if llama_python:
            _recache(path)
            got["llama.cpp"].append(_child(llama_python, _LLAMA_CHILD, path, threads,
                                           dict(os.environ), notes, label))
    return got


def _child(python: str, code: str, path: Path, threads: int, env: dict,
           notes: list[str], label: str) -> dict:
    env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [_repo_root(),
                                                              env.get("PYTHONPATH")])))
    proc = subprocess.run([python, "-c", code, str(path), str(threads)], capture_output=True,
                          text=True, env=env, timeout=600)
    got = parse_reports(proc.stdout)
    if proc.returncode != 0 or not got:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no message"]
        notes.append(f"{label}: a run failed ({tail[0][:200]})")
        return {}
    got["total_s"] = got["import_s"] + got["load_s"]
    return got


def best_of(runs: list[dict]) -> dict:
    """Each figure's least over the runs that reported it (the machine is shared)."""
    keys = {key for run in runs for key in run}
    return {key: min(run[key] for run in runs if key in run) for key in sorted(keys)}


def load_rows(size: str, best: dict[str, dict]) -> list[dict]:
    llama = best.get("llama.cpp", {})
    rows = []
    for side, got in best.items():
        row = {"size": size, "side": side}
        for key in ("import_s", "load_s", "total_s"):
            row[key.replace("_s", " s")] = _round(got.get(key))
        if side != "llama.cpp":
            row["total / llama.cpp"] = _ratio(got.get("total_s"), llama.get("total_s"))
            row["load / llama.cpp"] = _ratio(got.get("load_s"), llama.get("load_s"))
        rows.append(row)
    return rows


def load_targets(size: str, best: dict[str, dict]) -> list:
    from engine.bench.setup import Target

    llama = best.get("llama.cpp", {}).get("total_s")
    targets = []
    for phase in PHASES:
        ratio = _ratio(best.get(f"folio {phase}", {}).get("total_s"), llama)
        if ratio is not None:
            targets.append(Target(f"{size.upper()} load in a fresh process, {phase} load, "
                                  "Folio / llama.cpp", ratio, BAR, "<="))
    return targets


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 2) if ours and theirs else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _llama_status(python: str) -> str | None:
    try:
        done = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"llama.cpp skipped: {python} does not run ({exc})"
    if done.returncode:
        return (f"llama.cpp skipped: {python} cannot import llama_cpp (set "
                f"{_LLAMA_PYTHON} to an interpreter that can)")
    return None


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[2])

