"""``folio bench kv``'s table: the figures one run measured (``KVFigures``) as one row per
issue target (met / not met, or n/a with why) and per figure reported beside them.

Every ratio is the format under test over its baseline from the same run: bytes and peak
RSS lower is better, rates (decode tok/s, prefill tokens/s as prompt / TTFT) higher.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from engine.bench.kv_quality import Parting
from engine.bench.setup import Target
from engine.bench.target_rows import target_row

BYTES_BARS = {"int8": 0.53, "int4": 0.28}
KL_BARS = {"int8": 0.002, "int4": 0.02}
GREEDY_SHARE = 0.8  # int8: 4 of 5 replies equal to float16's
DECODE_BARS = (1.05, 1.15)  # int8 / float16 at the plan's two contexts
PREFILL_BAR = 0.95
LLAMA_BAR = 1.5  # Folio int8 / llama.cpp q8_0 decode at the first context
RSS_BAR = 1.0


@dataclass(slots=True)
class KVFigures:
    """What a run measured; a part missing is in ``why`` (by part or side) or absent."""

    model_name: str = "starter"  # the bench's --model (its quality and bytes rows)
    model_bytes: dict[str, int] = field(default_factory=dict)  # format -> bytes per token
    loaded_bytes: dict[str, int] = field(default_factory=dict)  # as the engine counted
    speed_shape: dict[str, int] = field(default_factory=dict)  # the 1B shape's bytes
    kl: dict[str, float] = field(default_factory=dict)
    greedy: dict[str, int] = field(default_factory=dict)
    partings: dict[str, list[Parting]] = field(default_factory=dict)  # replies not equal
    # "folio int8", "llama q8_0" -> {"ttft_s_4000": ..., "decode_tok_s_4000": ...}
    speed: dict[str, dict] = field(default_factory=dict)
    rss: dict[str, int] = field(default_factory=dict)  # "folio int8", "llama q8_0"
    why: dict[str, str] = field(default_factory=dict)  # "speed", "rss", "folio int8"

    def as_dict(self) -> dict:
        return asdict(self)


def kv_table(fig: KVFigures, plan) -> tuple[list[dict], list[Target]]:
    """The rows (figure, measured, value, want, status) and the targets they met or not."""
    rows: list[dict] = []
    targets: list[Target] = []

    def row(label: str, value: float | None, measured: str, op: str = "",
            bar: float | None = None, why: str = "not measured") -> None:
        rows.append(target_row(targets, label, value, measured, op, bar, why))

    size = f"{plan.speed_size.upper()} shape"
    for name, bar in BYTES_BARS.items():
        for shape, got in ((fig.model_name, fig.model_bytes), (size, fig.speed_shape)):
            ratio = _ratio(got.get(name), got.get("float16"))
            row(f"KV bytes per token, {name} / float16, {shape}", ratio,
                _pair(got.get(name), got.get("float16"), "B"), "<=", bar)
    for name, loaded in fig.loaded_bytes.items():
        row(f"KV bytes per token, {name}, {fig.model_name} loaded (engine's count)", loaded,
            f"{loaded:,} B")
    for name, bar in KL_BARS.items():
        row(f"{fig.model_name}, teacher-forced {plan.text_tokens:,} tokens, mean KL vs float16, "
            f"{name} (nats)", fig.kl.get(name), _num(fig.kl.get(name)), "<=", bar,
            _why(fig, f"folio {name}"))
    greedy_bar = math.ceil(GREEDY_SHARE * plan.prompts)
    for name in ("int8", "int4"):
        equal = fig.greedy.get(name)
        row(f"{fig.model_name}, greedy {plan.reply_tokens}-token replies after ~"
            f"{plan.context_words:,} words equal to float16, {name} (of {plan.prompts})",
            equal, "" if equal is None else
            f"{equal} of {plan.prompts}{_parted(fig.partings.get(name, []))}",
            ">=" if name == "int8" else "", greedy_bar if name == "int8" else None,
            _why(fig, f"folio {name}"))
    speed_why = fig.why.get("speed", "")
    for context, bar in zip(plan.contexts, DECODE_BARS, strict=True):
        for name in ("int8", "int4"):
            key = f"decode_tok_s_{context}"
            a, b = _speed(fig, f"folio {name}", key), _speed(fig, "folio float16", key)
            row(f"{size}, decode at {context:,} tokens of context, {name} / float16",
                _ratio(a, b), _pair(a, b, "tok/s"), ">=" if name == "int8" else "",
                bar if name == "int8" else None, speed_why or _why(fig, f"folio {name}"))
    first = plan.contexts[0]
    key = f"ttft_s_{first}"
    a, b = _speed(fig, "folio int8", key), _speed(fig, "folio float16", key)
    row(f"{size}, prefill of {first:,} tokens, int8 / float16", _ratio(b, a),
        _pair(_rate(first, a), _rate(first, b), "tok/s"), ">=", PREFILL_BAR,
        speed_why or _why(fig, "folio int8"))
    key = f"decode_tok_s_{first}"
    for ours, theirs, bar in (("int8", "q8_0", LLAMA_BAR), ("int4", "q4_0", None),
                              ("float16", "q8_0", None)):
        a, b = _speed(fig, f"folio {ours}", key), _speed(fig, f"llama {theirs}", key)
        row(f"{size} at {first:,} tokens, decode Folio {ours} / llama.cpp {theirs}",
            _ratio(a, b), _pair(a, b, "tok/s"), ">=" if bar else "", bar,
            speed_why or _why(fig, f"folio {ours}", f"llama {theirs}"))
    a, b = fig.rss.get("folio int8"), fig.rss.get("llama q8_0")
    row(f"{plan.rss_size.upper()} shape at a {plan.rss_context:,}-token context, peak RSS "
        f"Folio int8 / llama.cpp q8_0", _ratio(a, b),
        _pair(_mib(a), _mib(b), "MiB"), "<=", RSS_BAR,
        fig.why.get("rss") or _why(fig, "folio int8", "llama q8_0"))
    return rows, targets


def _speed(fig: KVFigures, side: str, key: str) -> float | None:
    value = fig.speed.get(side, {}).get(key)
    return value if isinstance(value, int | float) and value > 0 else None


def _why(fig: KVFigures, *sides: str) -> str:
    for side in sides:
        if side in fig.why:
            return fig.why[side]
    if any(side.startswith("llama") for side in sides):
        return "not measured (llama.cpp skipped or failed: see the notes)"
    return "not measured (see the notes)"


def _parted(partings: list[Parting]) -> str:
    """Where the other replies part from float16's: the token (counted from 1) and how far
    apart float16's two likeliest tokens were there, which says whether a near-tie
    decided it."""
    if not partings:
        return ""
    plural = "s" if len(partings) > 1 else ""
    text = f"; the other{plural} part{'' if plural else 's'} at token{plural} " + ", ".join(
        str(p.token + 1) for p in partings)
    if any(p.float16_gap is None for p in partings):
        return text
    gaps = ", ".join(f"{p.float16_gap:.2g}" for p in partings)
    return f"{text}, where float16's top two were {gaps} nats apart"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _rate(tokens: int, seconds: float | None) -> float | None:
    return tokens / seconds if seconds else None


def _mib(value: int | None) -> float | None:
    return value / 2**20 if value else None


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.5f}"


def _pair(a: float | None, b: float | None, unit: str) -> str:
    def show(v: float | None) -> str:
        if v is None:
            return "–"
        return f"{v:,}" if isinstance(v, int) else f"{v:,.1f}"

    return "" if a is None and b is None else f"{show(a)} / {show(b)} {unit}"
