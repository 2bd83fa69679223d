"""``folio bench speculative``'s table: what one run measured (``SpecFigures``) as one row
per issue target (met / not met, or n/a with why) and per figure reported beside them.

Every ratio is one side's decode rate (first token to last, the best of its runs) over its
baseline's from the same run. A row also says how many drafts the model kept and whether
the reply's tokens are the plain reply's: the native CPU path sums attention in an order
that depends on the batch, so a verify step's rows can differ from a decode step's in the
last bits of a float, and a near tie can then go the other way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.bench.setup import Target
from engine.bench.target_rows import target_row

NGRAM_BAR = 1.0  # ngram / plain on the code edit: never slower
LLAMA_BAR = 1.5  # Folio ngram / llama.cpp prompt lookup
PROSE_BAR = 0.97  # ngram / plain where nothing repeats
EXACT_BARS = {"model": 3.0, "1b": 3.0, "3b": 2.5}  # the exact reply as prediction / plain


@dataclass(slots=True)
class SpecFigures:
    """What a run measured. ``runs`` maps a side ("folio", "llama plain", "llama lookup",
    "folio 1b", ...) to its runs by "{chat}/{variant}": {"tok_s": [...], "ids": [...],
    "drafted", "accepted"}; a side not run is in ``why``."""

    model_name: str = "starter"
    runs: dict[str, dict[str, dict]] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    def rate(self, side: str, key: str) -> float | None:
        rates = [r for r in self.runs.get(side, {}).get(key, {}).get("tok_s", []) if r > 0]
        return max(rates) if rates else None


def spec_table(fig: SpecFigures, shapes: tuple[str, ...]) -> tuple[list[dict], list[Target]]:
    """The rows (figure, measured, value, want, status) and the targets met or not."""
    rows: list[dict] = []
    targets: list[Target] = []

    def row(label: str, a: tuple[str, str], b: tuple[str, str], bar: float | None = None,
            op: str = ">=", detail: str = "") -> None:
        ra, rb = fig.rate(*a), fig.rate(*b)
        value = ra / rb if ra and rb else None
        measured = "" if value is None else f"{ra:,.1f} / {rb:,.1f} tok/s" + detail
        why = "" if value is not None else _why(fig, a[0], b[0])
        rows.append(target_row(targets, label, value, measured, op, bar, why, digits=3))

    name = fig.model_name
    code = f"{name} code-edit chat"
    row(f"{code}, decode Folio ngram / Folio plain", ("folio", "code/ngram"),
        ("folio", "code/plain"), NGRAM_BAR, detail=_drafts(fig, "folio", "code/ngram"))
    row(f"{code}, Folio ngram / llama.cpp prompt lookup", ("folio", "code/ngram"),
        ("llama lookup", "code/lookup"), LLAMA_BAR)
    row(f"{code}, Folio plain / llama.cpp plain", ("folio", "code/plain"),
        ("llama plain", "code/plain"))
    row(f"{code}, llama.cpp prompt lookup / llama.cpp plain", ("llama lookup", "code/lookup"),
        ("llama plain", "code/plain"),
        detail=_same(fig, ("llama lookup", "code/lookup"), ("llama plain", "code/plain")))
    row(f"{name} free-prose chat, decode Folio ngram / Folio plain", ("folio", "prose/ngram"),
        ("folio", "prose/plain"), PROSE_BAR, detail=_drafts(fig, "folio", "prose/ngram"))
    row(f"{name} free-prose chat, llama.cpp prompt lookup / llama.cpp plain",
        ("llama lookup", "prose/lookup"), ("llama plain", "prose/plain"))
    row(f"{code}, Predicted Outputs (the plain reply as prediction) / plain",
        ("folio", "code/exact"), ("folio", "code/plain"), EXACT_BARS["model"],
        detail=_drafts(fig, "folio", "code/exact"))
    for size in shapes:
        side = f"folio {size}"
        shape = f"{size.upper()} shape code-edit chat (random weights)"
        row(f"{shape}, Predicted Outputs (its plain reply's ids as prediction, float32 KV "
            "pool) / plain",
            (side, "code/exact"), (side, "code/plain"), EXACT_BARS.get(size),
            detail=_drafts(fig, side, "code/exact"))
        row(f"{shape}, decode Folio ngram / Folio plain", (side, "code/ngram"),
            (side, "code/plain"), detail=_drafts(fig, side, "code/ngram"))
    row(f"{code}, Predicted Outputs (the prompt's code as prediction) / plain",
        ("folio", "code/code"), ("folio", "code/plain"),
        detail=_drafts(fig, "folio", "code/code"))
    # A model drafting for itself is right every time (but where the verify step's rows
    # part from decode's at a near tie): the draft model's whole cost, the overhead ceiling.
    row(f"{code}, the model drafting for itself (draft: the same file), k = 4 / plain",
        ("folio", "code/self_k4"), ("folio", "code/plain"),
        detail=_drafts(fig, "folio", "code/self_k4"))
    # The same drafts for free (the plain reply as prediction): what k = 4 gives at most.
    row(f"{code}, the plain reply as prediction, at most 4 drafts a step / plain",
        ("folio", "code/exact_k4"), ("folio", "code/plain"),
        detail=_drafts(fig, "folio", "code/exact_k4"))
    return rows, targets


def _drafts(fig: SpecFigures, side: str, key: str) -> str:
    """The drafts kept, the share of the reply they made, and whether the reply is the
    plain one's."""
    got = fig.runs.get(side, {}).get(key)
    if not got:
        return ""
    drafted, kept, n = got.get("drafted", 0), got.get("accepted", 0), len(got["ids"])
    text = "; no drafts" if not drafted else (
        f"; drafts {kept / drafted:.0%} kept ({kept:,} of {drafted:,}), "
        f"{kept / max(n, 1):.0%} of the reply's {n:,} tokens")
    plain = fig.runs.get(side, {}).get(key.split("/")[0] + "/plain", {})
    if key.endswith(("/exact", "/exact_k4")) and "text_ids" in plain:
        agree, total = plain["text_ids"]
        text += ("; the prediction's text tokenizes to the reply's ids" if agree >= total
                 else f"; the prediction's text tokenizes to other ids than the reply's "
                      f"from token {agree:,} of {total:,} on")
    return text + _same(fig, (side, key), (side, key.split("/")[0] + "/plain"))


def _same(fig: SpecFigures, a: tuple[str, str], b: tuple[str, str]) -> str:
    ids_a = fig.runs.get(a[0], {}).get(a[1], {}).get("ids")
    ids_b = fig.runs.get(b[0], {}).get(b[1], {}).get("ids")
    if ids_a is None or ids_b is None:
        return ""
    if ids_a == ids_b:
        return "; same tokens as plain"
    first = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y),
                 min(len(ids_a), len(ids_b)))
    return f"; tokens differ from plain from token {first:,} on"


def _why(fig: SpecFigures, *sides: str) -> str:
    for side in sides:
        if side in fig.why:
            return fig.why[side]
    return "not measured (see the notes)"
