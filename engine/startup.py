"""Starting a process without the cyclic garbage collector's passes.

Importing torch and the engine and then loading a model makes some 300,000 container
objects, and CPython's cyclic collector walks them again and again while they are being
made (a full pass walks every object alive): about a fifth of a start
(docs/BENCHMARKS.md, "Starting without the cyclic collector"). ``folio chat``, ``folio
serve`` and the app start in three steps:

1. ``pause_collection`` before their imports;
2. ``freeze_imports`` once imported, before the first model loads: what exists then
   (modules, classes, functions) lives as long as the process, so it goes to the
   collector's permanent generation and no later pass walks it again. The little
   cyclic garbage that importing leaves (about 1 MB in all) stays with it;
3. ``resume_collection`` once the first model has loaded or failed to: one pass over what
   the load made, then the collector runs as before. The model's objects are not frozen:
   unloading it frees them as it always did.

Only a process whose start is its own does this: a library caller of ``engine.LLM`` and
``folio bench`` never pause.
"""

from __future__ import annotations

import gc

_paused = False  # by pause_collection, so the other two leave others' settings be


def pause_collection() -> None:
    """Switch the cyclic collector off until resume_collection (no-op if it is off)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def freeze_imports() -> None:
    """Move every object alive now to the permanent generation; only while paused."""
    if _paused:
        gc.freeze()


def resume_collection() -> None:
    """Collect what the start left and switch the collector back on; only undoes
    pause_collection, and only once (later calls do nothing)."""
    global _paused
    if _paused:
        _paused = False
        gc.collect()
        gc.enable()
