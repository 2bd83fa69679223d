"""Which loaded models make room for another within the memory budget.

The budget counts weights and KV pools together. Room is made from idle models only,
least recently used first; a model with a running request, or one still loading, is never
unloaded. When even every idle model would not make room, nothing is unloaded and
``ModelWontFit`` says what the model needs, the budget, and what holds the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GIB = 1 << 30


class ModelWontFit(Exception):
    """A model that cannot be loaded within the budget, said before anything is loaded."""


@dataclass(slots=True, frozen=True)
class Resident:
    """What planning needs of one model in the host."""

    name: str
    total_bytes: int
    busy: bool  # a running request, or still loading
    last_used: float


def plan_room(name: str, need: int, budget: int | None,
              residents: Sequence[Resident]) -> list[str]:
    """The models to unload, in order, so that `need` more bytes fit; raises ModelWontFit
    when they cannot be found among the idle ones."""
    if budget is None:
        return []
    used = sum(r.total_bytes for r in residents)
    if used + need <= budget:
        return []
    if need > budget:
        raise ModelWontFit(f"model {name!r} needs {_gib(need)} (weights and KV pool), more "
                           f"than the whole memory budget of {_gib(budget)}")
    victims: list[str] = []
    for resident in sorted((r for r in residents if not r.busy), key=lambda r: r.last_used):
        victims.append(resident.name)
        used -= resident.total_bytes
        if used + need <= budget:
            return victims
    busy = [f"{r.name} ({_gib(r.total_bytes)}, busy)" for r in residents if r.busy]
    idle = [f"{r.name} ({_gib(r.total_bytes)})" for r in residents if not r.busy]
    raise ModelWontFit(
        f"model {name!r} needs {_gib(need)} (weights and KV pool) and the memory budget of "
        f"{_gib(budget)} has {_gib(max(0, budget - sum(r.total_bytes for r in residents)))} "
        f"free; it would have to unload {', '.join(busy + idle)}, and busy models are not "
        "unloaded: retry when their requests end")


def _gib(size: int) -> str:
    return f"{size / GIB:.2f} GiB"


# The share of the machine's memory (the card's on CUDA) hosted models may take by
# default: the rest stays for the process's activations, the OS and other programs.
DEFAULT_BUDGET_SHARE = 0.75


def default_budget_bytes(config) -> int:
    """DEFAULT_BUDGET_SHARE of the device's memory: the CUDA card's where the config
    runs on one, else the machine's physical memory."""
    import os

    import torch

    device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(total * DEFAULT_BUDGET_SHARE)
