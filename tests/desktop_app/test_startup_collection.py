"""The app starts as `folio chat` does (engine/startup.py): the cyclic collector is off
from before the engine's imports until the first model has loaded or failed to load,
and on again after; with --no-model it is on again as soon as the window shows. The
engine (torch with it) is imported before Qt, whose import hook would read the source of
every module imported after it."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

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


_CHILD = """
import sys
from desktop_app.__main__ import main
code = main(["--no-model", "--quit-after-ms", "0"])
order = list(sys.modules)
qt = order.index("PySide6")
print(code, order.index("torch") < qt, order.index("engine.llm") < qt)
"""


def test_the_engine_is_imported_before_qt(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(repo),
               FOLIO_DATA_DIR=str(tmp_path / "data"), FOLIO_CONFIG_DIR=str(tmp_path / "config"))
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          env=env, cwd=repo, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == ["0", "True", "True"]
