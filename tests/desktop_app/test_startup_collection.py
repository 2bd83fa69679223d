"""The app starts as `folio chat` does (engine/startup.py): the cyclic collector is off
from before the engine's imports until the first model has loaded or failed to load,
and on again after; with --no-model it is on again as soon as the window shows."""

from __future__ import annotations

import gc

import pytest

from desktop_app.__main__ import main
from engine import startup
from engine.llm_engine import LLMEngine


@pytest.fixture(autouse=True)
def collector_back_on():
    yield
    startup.resume_collection()
    gc.enable()
    gc.unfreeze()


def test_the_first_model_loads_paused_and_the_collector_is_on_after(monkeypatch,
                                                                    tiny_model_path):
    seen = []
    real_init = LLMEngine.__init__

    def recording_init(self, *args, **kwargs):
        seen.append(gc.isenabled())
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(LLMEngine, "__init__", recording_init)
    resumed = []
    real_resume = startup.resume_collection
    monkeypatch.setattr(startup, "resume_collection",
                        lambda: resumed.append(gc.isenabled()) or real_resume())
    assert main(["--model", str(tiny_model_path), "--quit-after-ms", "50"]) == 0
    assert seen == [False]  # the engine thread built it with the collector off
    assert resumed and resumed[0] is False  # the load's signal resumed it
    assert gc.isenabled()


def test_without_a_model_the_collector_is_on_once_the_window_shows(monkeypatch):
    assert main(["--no-model", "--quit-after-ms", "0"]) == 0
    assert gc.isenabled()
