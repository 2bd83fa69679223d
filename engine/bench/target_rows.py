"""One row of a workload's targets table (``folio bench kv``, ``speculative``): its figure,
what was measured, the value, the bar and whether the value met it, n/a with the reason
where nothing was measured, "reported" where there is no bar."""

from __future__ import annotations

from engine.bench.setup import Target


def target_row(targets: list[Target], label: str, value: float | None, measured: str,
               op: str = ">=", bar: float | None = None, why: str = "not measured",
               digits: int = 4) -> dict:
    """The row of ``label``; a value held to a bar joins ``targets``. ``digits``: how
    the value is shown (the target keeps 4)."""
    if value is None:
        status = f"n/a: {why}"
    elif bar is None:
        status = "reported"
    else:
        target = Target(label, round(value, 4), bar, op)
        targets.append(target)
        status = "met" if target.met else "not met"
    return {"figure": label, "measured": measured,
            "value": "" if value is None else round(value, digits),
            "want": "" if bar is None else f"{op} {bar:g}", "status": status}
