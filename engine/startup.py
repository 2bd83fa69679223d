"""Starting a process without the cyclic garbage collector's passes.

Importing torch and the engine and then loading a model makes some 300,000 container
objects that live as long as the process or the model, and CPython's cyclic collector
walks them again and again while they are being made (a full pass walks every object
alive): about a fifth of a start (docs/BENCHMARKS.md, "Starting without the cyclic
collector"). ``folio chat``, ``folio serve`` and the app call ``pause_collection`` before
their imports and ``resume_collection`` once their first model has loaded (or failed to):
one full pass then collects what the start left, a few hundred objects, and the
collector runs as before. Nothing is frozen: unloading a model frees it as it did.

Only processes whose start is theirs to time pause: a library caller of ``engine.LLM``
or ``folio bench`` never does.
"""

from __future__ import annotations

import gc

_paused = False  # by pause_collection, so resume_collection leaves others' settings be


def pause_collection() -> None:
    """Switch the cyclic collector off until resume_collection (no-op if it is off)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_collection() -> None:
    """Collect what the start left and switch the collector back on; only undoes
    pause_collection, and only once (later calls do nothing)."""
    global _paused
    if _paused:
        _paused = False
        gc.collect()
        gc.enable()
