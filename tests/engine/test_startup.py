"""engine/startup.py: a process's start without the cyclic collector's passes. The collector
is off from pause to resume, freezing happens only while paused, one pass on resume frees
the cycles made meanwhile, and only what pause switched off is switched back on. ``folio
chat`` and ``folio serve`` freeze their imports, load their model paused (the model itself
not frozen) and resume once it has loaded or failed to; other commands never pause."""

from __future__ import annotations

import gc
import weakref

import pytest

from engine import cli, startup
from engine.loaders.base import FolioLoadError


@pytest.fixture(autouse=True)
def collector_back_on():
    yield
    startup.resume_collection()
    gc.enable()
    gc.unfreeze()  # this test process's objects back under the collector


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_cycle_made_while_paused_is_freed_on_resume():
    startup.pause_collection()
    assert not gc.isenabled()
    ref = weakref.ref(_Cycle())
    kept = [[] for _ in range(3000)]  # live containers: past the threshold of a pass
    assert ref() is not None
    del kept
    startup.resume_collection()
    assert gc.isenabled() and ref() is None


def test_only_a_paused_start_freezes():
    gc.unfreeze()
    startup.freeze_imports()  # not paused: nothing moves
    assert gc.get_freeze_count() == 0
    startup.pause_collection()
    startup.freeze_imports()
    assert gc.get_freeze_count() > 0
    made_after = _Cycle()
    assert any(o is made_after for o in gc.get_objects())  # still under the collector
    made_after.me = None


def test_resume_leaves_a_collector_someone_else_switched_off():
    gc.disable()
    startup.pause_collection()  # already off: not ours
    startup.resume_collection()
    assert not gc.isenabled()


def test_resume_undoes_one_pause_once():
    startup.pause_collection()
    startup.resume_collection()
    gc.disable()  # someone else's, after ours ended
    startup.resume_collection()
    assert not gc.isenabled()


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_chat_and_serve_load_their_model_paused(monkeypatch, capsys, command):
    seen = []

    def refuse(*args, **kwargs):
        seen.append(gc.isenabled())
        raise FolioLoadError("no such model")

    monkeypatch.setattr("engine.llm.LLM", refuse)
    monkeypatch.setattr("engine.serve.hosted.HostedServe.start", refuse)
    monkeypatch.setattr("engine.serve.server.check_port_free", lambda *a: None)
    assert cli.main([command, "--model", "starter"]) == 2
    assert seen == [False]  # the load ran with the collector off
    assert gc.isenabled()  # and a failed start switched it back on
    assert "no such model" in capsys.readouterr().err


def test_chat_resumes_once_its_model_has_loaded(monkeypatch, capsys):
    seen = []

    class Loaded:
        model_name = "fake"

        def __init__(self, *args, **kwargs) -> None:
            seen.append(("load", gc.isenabled()))

        def close(self) -> None:
            pass

    def chat(llm, *args, **kwargs):
        seen.append(("chat", gc.isenabled()))
        # The model was made after the freeze: it stays under the collector.
        seen.append(("model frozen", not any(o is llm for o in gc.get_objects())))
        raise ValueError("stop here")

    monkeypatch.setattr("engine.llm.LLM", Loaded)
    monkeypatch.setattr(cli, "TerminalChat", chat)
    assert cli.main(["chat", "--model", "starter"]) == 2
    assert seen == [("load", False), ("chat", True), ("model frozen", False)]
    assert gc.get_freeze_count() > 0  # what chat imported was frozen


def test_other_commands_never_pause(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(cli, "cmd_models", lambda args: seen.append(gc.isenabled()) or 0)
    assert cli.main(["models"]) == 0
    assert seen == [True]
