"""``folio bench speculative``: how much faster Folio's drafts make a reply (engine/spec),
beside its own plain decode and beside llama.cpp plain and with its prompt-lookup drafts,
in one run; every figure's baseline measured in the same run, the CPU named.

Two chats (speculative_text), rendered once into prompt ids with the model's chat template
and answered greedily from the very same ids by every side, up to ``max_tokens`` tokens:

- **code edit**: a short Python file pasted whole, asked back with one variable renamed.
  Folio plain, ``ngram`` (prompt lookup over the request's own tokens), Predicted Outputs
  with the plain reply's text as the prediction (every draft the model's own choice: what
  verifying k tokens in one forward buys when nothing is rejected) and with the prompt's
  code as the prediction (what an editor would send), and the model drafting for itself
  (``draft:`` its own file, at most 4 drafts a step: every draft right, so the ratio is the
  draft model's whole overhead) beside the exact prediction checked 4 at a time (the same
  drafts for free);
- **free prose**: a question whose answer repeats nothing; ``ngram`` must cost nothing.

llama.cpp (its interpreter: FOLIO_BENCH_LLAMA_PYTHON, else this one) runs the model's GGUF
plain and with ``LlamaPromptLookupDecoding(num_pred_tokens=10)`` as its draft model, each
in a fresh process. The synthetic 1B and 3B shapes (synthetic.py; ``shapes`` that are among
``--sizes``) answer the code edit with ``ignore_eos``: their weights are random, so their
replies copy nothing and the prediction is their own plain reply, given as its token ids
(a random reply's text tokenizes to other ids), on float32 KV pools (both sides): a verify
step sums float16 keys in another order than decode does, and a random model's near ties
then part the reply from the prediction. The ratio measures the verify step's cost at that
size (one forward over k tokens against k decode steps), not how often a real model of
that size would be right.

Each Folio side is one fresh process (``speculative_sides.folio``) running its variants in
turn, ``runs`` rounds, the best rate of each kept. ``SpecPlan`` holds the sizes (the
issue's by default; ``QUICK`` for a test). The table (speculative_table) has every target
with met / not met / n/a.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.bench.speculative_table import SpecFigures, spec_table

CODE_VARIANTS = ("plain", "ngram", "exact", "code", "exact_k4", "self_k4")
SHAPE_VARIANTS = ("plain", "ngram", "exact")


@dataclass(frozen=True, slots=True)
class SpecPlan:
    max_tokens: int = 256
    runs: int = 3  # rounds of every variant on the model, and of each llama.cpp side
    shape_runs: int = 2  # rounds on each synthetic shape
    shapes: tuple[str, ...] = ("1b", "3b")
    num_speculative_tokens: int = 8  # the engine's most drafts a step (but "exact_k4")
    timeout_s: float = 1800.0  # each fresh process's limit

    def __post_init__(self) -> None:
        for name in ("max_tokens", "runs", "shape_runs", "num_speculative_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"SpecPlan.{name} must be an integer >= 1, got {value!r}")
        if self.max_tokens < 2:
            raise ValueError(f"SpecPlan.max_tokens must be >= 2 (a decode rate needs two "
                             f"tokens), got {self.max_tokens}")
        from engine.bench.setup import check_sizes

        if self.shapes:
            check_sizes(self.shapes)


QUICK = SpecPlan(max_tokens=12, runs=1, shape_runs=1, timeout_s=600.0)


@dataclass(slots=True)
class _Run:
    plan: SpecPlan
    threads: int
    figures: SpecFigures = field(default_factory=SpecFigures)
    notes: list[str] = field(default_factory=list)


def bench_speculative(ctx, plan: SpecPlan | None = None) -> dict:
    from engine.bench.common import bench_result
    from engine.bench.kv import cpu_name, llama_python
    from engine.bench.probe import run_probe
    from engine.bench.speculative_text import CODE

    run = _Run(plan or SpecPlan(), ctx.threads)
    p, fig = run.plan, run.figures
    model = str(ctx.model_path)
    fig.model_name = _model_name(ctx.model_path)
    prompts = run_probe("engine.bench.speculative_sides:prompt_ids", {"model_path": model},
                        p.timeout_s)
    if "error" in prompts:
        raise RuntimeError(f"the chats' prompt ids: {prompts['error']}")
    chats, stops = prompts["chats"], prompts["stop_ids"]
    tasks = [["code", v] for v in CODE_VARIANTS] + [["prose", v] for v in ("plain", "ngram")]
    _folio(run, "folio", model, chats, tasks, p.runs, False, CODE)
    python, why = llama_python()
    if why is None and ctx.model_path.suffix.lower() != ".gguf":
        why = "llama.cpp skipped: it needs a .gguf file, the model is a folder"
    for lookup in (False, True):
        side = f"llama {'lookup' if lookup else 'plain'}"
        if why:
            fig.why[side] = why
            continue
        got = run_probe("engine.bench.speculative_sides:llama_cpp", {
            "model_path": model, "threads": run.threads, "chats": chats, "lookup": lookup,
            "max_tokens": p.max_tokens, "runs": p.runs, "stop_ids": stops},
            p.timeout_s, python=python)
        _keep(run, side, got)
    if why:
        run.notes.append(why)
    for size in p.shapes:
        side = f"folio {size}"
        if size not in ctx.settings.sizes:
            fig.why[side] = f"{size} not run (--sizes)"
            continue
        tasks = [["code", v] for v in SHAPE_VARIANTS]
        _folio(run, side, str(_shape_path(size)), {"code": chats["code"]}, tasks,
               p.shape_runs, True, CODE, exact_ids=True)
    rows, targets = spec_table(fig, p.shapes)
    summary = {"cpu": cpu_name(), "threads": ctx.threads, "plan": _plan_text(p, chats)}
    result = bench_result("speculative", ctx, rows, summary, targets, run.notes)
    result["setup"]["cpu"] = summary["cpu"]
    result["figures"] = fig.as_dict()
    return result


def _folio(run: _Run, side: str, model: str, chats: dict, tasks: list, runs: int,
           ignore_eos: bool, prediction: str, exact_ids: bool = False) -> None:
    from engine.bench.probe import run_probe

    p = run.plan
    got = run_probe("engine.bench.speculative_sides:folio", {
        "model_path": model, "threads": run.threads, "chats": chats, "tasks": tasks,
        "max_tokens": p.max_tokens, "runs": runs, "ignore_eos": ignore_eos,
        "num_speculative_tokens": p.num_speculative_tokens, "prediction": prediction,
        "exact_ids": exact_ids},
        p.timeout_s)
    _keep(run, side, got)


def _keep(run: _Run, side: str, got: dict) -> None:
    if "error" in got:
        run.notes.append(f"{side}: {got.pop('error')}")
    got.pop("loaded", None)
    run.figures.runs[side] = got
    if not got:
        run.figures.why[side] = "did not run (see the notes)"


def _model_name(path) -> str:
    from engine.loaders.catalog import starter_path

    return "starter" if path == starter_path() else path.stem


def _shape_path(size: str):
    from engine.bench import synthetic
    from engine.loaders.catalog import starter_path

    path, _ = synthetic.ensure_synthetic_gguf(starter_path(), synthetic.SIZES[size])
    return path


def _plan_text(plan: SpecPlan, chats: dict[str, list[int]]) -> str:
    return (f"greedy, up to {plan.max_tokens} tokens; code-edit prompt {len(chats['code'])} "
            f"ids, prose {len(chats['prose'])}; best of {plan.runs} runs per side "
            f"({plan.shape_runs} on each shape); at most {plan.num_speculative_tokens} "
            f"drafts a step (llama.cpp: 10)")
