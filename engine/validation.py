"""Validation of user-facing settings: a ValueError that names the field."""

from __future__ import annotations


class FieldChecker:
    """``check = FieldChecker("SamplingParams")``; ``check(ok, "top_p", value, "in (0, 1]")``
    raises ``ValueError("SamplingParams.top_p must be in (0, 1], got 2")`` when not ok."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    def __call__(self, ok: bool, name: str, value: object, expected: str) -> None:
        if not ok:
            raise ValueError(f"{self.owner}.{name} must be {expected}, got {value!r}")

    def types(self, obj: object, integers: tuple[str, ...], numbers: tuple[str, ...]) -> None:
        """Before the range checks: a string or a bool where a number belongs gets the same
        clear error instead of a TypeError. None passes here; the range checks decide."""
        for name in integers + numbers:
            value = getattr(obj, name)
            kinds = (int,) if name in integers else (int, float)
            ok = value is None or (isinstance(value, kinds) and not isinstance(value, bool))
            self(ok, name, value, "an integer" if name in integers else "a number")
