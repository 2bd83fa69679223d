"""The issue's targets in one table at the end of ``folio bench all``: each row's value as
measured in this run, its bar, and met / not met / n/a (with why).

Each workload already reports its targets (``result["targets"]``); this table only picks
the issue's rows out of them by name, so a figure and its verdict are computed in one place.
A row is n/a when its workload did not run, when its size was not among ``--sizes``
(sizes), when it needs llama.cpp and llama.cpp did not run, or when the workload could not
measure it (the workload's notes say why).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.bench.chat import recompute_target
from engine.bench.decode import llama_decode_target, llama_ttft_target
from engine.bench.eight_b import DECODE_TARGET, LOADS_TARGET
from engine.bench.memory import RSS_TARGET, WEIGHTS_TARGET
from engine.bench.moe import BARS as MOE_BARS
from engine.bench.moe import moe_target
from engine.bench.sizes import BARS, size_target
from engine.bench.structured import (
    CACHED_TARGET,
    FIRST_TARGET,
    MASK_TARGET,
    ROUND_TRIP_TARGET,
)

LLAMA_MISSING = "n/a: llama.cpp not installed"


@dataclass(frozen=True, slots=True)
class IssueTarget:
    label: str  # as the issue words it
    workload: str
    name: str  # the Target's name in that workload's result
    needs_llama: bool
    size: str | None = None  # sizes: the size the row is about


# sizes: how the issue words each figure.
_SIZE_LABELS = {
    "decode_tok_s": "decode tok/s after a 512-token prompt",
    "ttft_s": "TTFT of a 512-token prompt",
    "followup_ttft_s": "TTFT of a follow-up turn (prompt + reply + 64 tokens)",
    "load_s": "load time (fresh process)",
    "peak_rss_bytes": "peak RSS (fresh process)",
}
SIZE_TARGETS = tuple(
    IssueTarget(f"synthetic {size.upper()} Q4_K_M {_SIZE_LABELS[metric]}, Folio / llama.cpp",
                "sizes", size_target(size, metric), True, size)
    for size in ("1b", "3b", "8b") for metric in BARS if size in BARS[metric][2])

ISSUE_TARGETS = (
    IssueTarget("decode tok/s at context 128, Folio / llama.cpp", "decode",
                llama_decode_target(128), True),
    IssueTarget("decode tok/s at context 2,048, Folio / llama.cpp", "decode",
                llama_decode_target(2048), True),
    IssueTarget("TTFT of a 2,048-token prompt, Folio / llama.cpp", "decode",
                llama_ttft_target(2048), True),
    IssueTarget("peak RSS after one chat, 8,192-token context, Folio / llama.cpp", "memory",
                RSS_TARGET, True),
    IssueTarget("resident weight bytes / GGUF tensor bytes", "memory", WEIGHTS_TARGET, False),
    IssueTarget("synthetic 8B Q4_K_M loads on this machine", "8b", LOADS_TARGET, False),
    IssueTarget("synthetic 8B Q4_K_M decode, Folio / llama.cpp", "8b", DECODE_TARGET, True),
    IssueTarget("candidates n=4 wall / n=1 wall (512-token prompt, 64 tokens)", "candidates",
                "Folio n=4 wall / n=1 wall", False),
    IssueTarget("chat turn-8 TTFT, transformers recomputing / Folio", "chat",
                recompute_target(8), False),
    IssueTarget("decode tok/s with a JSON-schema mask / without, starter", "structured",
                MASK_TARGET, False),
    IssueTarget("mask compile time for a 20-field schema, first use (ms)", "structured",
                FIRST_TARGET, False),
    IssueTarget("mask compile time for a 20-field schema, cached (ms)", "structured",
                CACHED_TARGET, False),
    IssueTarget("tool round trip through the API, second request's cached tokens / first "
                "request's prompt + reply", "structured", ROUND_TRIP_TARGET, False),
    *(IssueTarget(f"{moe_target(metric)} (best of the runs)", "moe", moe_target(metric), True)
      for metric in MOE_BARS),
    *SIZE_TARGETS,
)


def targets_table(results: dict[str, dict], llama_installed: bool) -> list[dict]:
    """One row per issue target: ``target``, ``value``, ``want``, ``status``."""
    rows = []
    for spec in ISSUE_TARGETS:
        row = {"target": spec.label, "value": "", "want": "", "status": ""}
        result = results.get(spec.workload)
        found = None
        if result is not None:
            found = next((t for t in result["targets"] if t["name"] == spec.name), None)
        if found is not None:
            row["want"] = f"{found['op']} {found['limit']:g}"
            if spec.name == LOADS_TARGET:
                row["value"] = "loads" if found["met"] else "does not load"
            else:
                row["value"] = f"{found['value']:g}"
            row["status"] = "met" if found["met"] else "not met"
        elif result is None:
            row["status"] = f"n/a: {spec.workload} did not run"
        elif spec.size is not None and spec.size not in result["summary"].get("sizes",
                                                                                (spec.size,)):
            row["status"] = f"n/a: {spec.size} not run (--sizes)"
        elif spec.needs_llama and not llama_installed:
            row["status"] = LLAMA_MISSING
        else:
            row["status"] = "n/a: not measured (see the workload's notes)"
        rows.append(row)
    return rows


def llama_cpp_installed() -> bool:
    """Whether llama_cpp imports (a package missing a dependency counts as not installed,
    as the workloads' own check does)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def format_targets(rows: list[dict]) -> str:
    """The table as aligned text (left-aligned labels, the verdict last)."""
    heads = ("target", "value", "want", "status")
    widths = [max(len(h), *(len(str(row[h])) for row in rows)) for h in heads]
    lines = ["== targets (this run) =="]
    lines.append("  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip())
    for row in rows:
        lines.append("  ".join(str(row[h]).ljust(w)
                               for h, w in zip(heads, widths, strict=True)).rstrip())
    return "\n".join(lines)
