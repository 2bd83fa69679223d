"""EngineBridge: background loads, queued re-emission of worker events, cancel, unload."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import QThread

from desktop_app.services.engine_bridge import EngineBridge, describe_error
from engine.sampling_params import SamplingParams


@pytest.fixture
def make_bridge(fake_engine):
    fake_llm, fake_worker = fake_engine

    def make(fail_on: str = "", progress_stages=("reading", "ready")):
        def factory(source, config=None, progress=None):
            for i, stage in enumerate(progress_stages):
                progress(stage, (i + 1) / len(progress_stages))
            if source == fail_on:
                raise ValueError(f"{source}: config.json is not valid JSON")
            return fake_llm(name=f"model-{source}")

        return EngineBridge(llm_factory=factory, worker_factory=fake_worker)

    return make


def test_load_reports_progress_then_loaded(qtbot, make_bridge):
    bridge = make_bridge()
    progress = []
    bridge.loadProgress.connect(lambda stage, frac: progress.append((stage, frac)))
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000) as loaded:
        bridge.load_model("a")
        assert bridge.is_loading and not bridge.is_loaded
    assert loaded.args == ["model-a"]
    assert progress == [("reading", 0.5), ("ready", 1.0)]
    assert bridge.is_loaded and not bridge.is_loading
    assert (bridge.source, bridge.model_name, bridge.max_model_len) == ("a", "model-a", 2048)
    bridge.shutdown()
    assert not bridge.is_loaded


def test_failed_load_keeps_the_previous_model(qtbot, make_bridge):
    bridge = make_bridge(fail_on="broken")
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        bridge.load_model("good")
    with qtbot.waitSignal(bridge.modelLoadFailed, timeout=5000) as failed:
        bridge.load_model("broken")
    assert failed.args == ["broken", "broken: config.json is not valid JSON"]
    assert bridge.model_name == "model-good"
    assert bridge.source == "good"
    bridge.shutdown()


def test_events_arrive_on_the_gui_thread_in_order(qtbot, make_bridge):
    bridge = make_bridge()
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        bridge.load_model("a")
    seen, threads = [], set()

    def on_token(rid, index, parts):
        threads.add(QThread.currentThread() is bridge.thread())
        seen.append((index, "".join(part.text for part in parts)))

    bridge.tokenArrived.connect(on_token)
    busy = []
    bridge.busyChanged.connect(busy.append)
    with qtbot.waitSignal(bridge.requestFinished, timeout=5000) as finished:
        rid = bridge.submit([{"role": "user", "content": "hi"}], SamplingParams(n=2, max_tokens=3))
        assert bridge.busy and bridge.in_flight() == [rid]
    assert finished.args[0] == rid
    output = finished.args[1]
    assert [c.text for c in output.outputs] == ["Reply1 c1w1 c1w2", "Reply2 c2w1 c2w2"]
    assert sorted(seen) == [(0, " c1w1"), (0, " c1w2"), (0, "Reply1"),
                            (1, " c2w1"), (1, " c2w2"), (1, "Reply2")]
    assert threads == {True}
    assert busy == [True, False]
    assert not bridge.busy
    bridge.shutdown()


def test_cancel_finishes_with_abort_and_error_event_fails(qtbot, make_bridge):
    bridge = make_bridge()
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        bridge.load_model("a")
    bridge._worker.gate.clear()
    rid = bridge.submit([{"role": "user", "content": "x"}], SamplingParams(max_tokens=5))
    with qtbot.waitSignal(bridge.requestFinished, timeout=5000) as finished:
        bridge.cancel(rid)
    assert finished.args[1].outputs[0].finish_reason == "abort"
    with qtbot.waitSignal(bridge.requestFailed, timeout=5000) as failed:
        bad = bridge.submit([{"role": "user", "content": "FAIL"}], SamplingParams())
    assert failed.args == [bad, "prompt is longer than the context (4096 > 2048)"]
    bridge.shutdown()


def test_unload_fails_requests_in_flight_and_drops_late_events(qtbot, make_bridge):
    bridge = make_bridge()
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        bridge.load_model("a")
    bridge._worker.gate.clear()
    rid = bridge.submit([{"role": "user", "content": "x"}], SamplingParams())
    finished = []
    bridge.requestFinished.connect(lambda *a: finished.append(a))
    with qtbot.waitSignal(bridge.requestFailed, timeout=5000) as failed, \
            qtbot.waitSignal(bridge.modelUnloaded, timeout=5000):
        bridge.unload_model()
    assert failed.args == [rid, "The model was unloaded before the reply finished."]
    assert not bridge.is_loaded and bridge.kv_stats() is None and bridge.memory_stats() is None
    qtbot.wait(100)
    assert finished == []  # the retired worker's abort event is not re-emitted


def test_submit_without_model_raises():
    bridge = EngineBridge(llm_factory=lambda *a, **k: None)
    try:
        bridge.submit([{"role": "user", "content": "x"}], SamplingParams())
    except RuntimeError as exc:
        assert "No model is loaded" in str(exc)
    else:
        raise AssertionError("submit without a model must raise")


def test_describe_error():
    assert describe_error(ValueError("bad value")) == "bad value"
    assert describe_error(KeyError("tok")) == "KeyError: 'tok'"
    assert describe_error(RuntimeError()) == "RuntimeError"
    assert threading.current_thread() is threading.main_thread()


def test_activity_follows_the_engine_for_the_apis_requests_too(qtbot, tiny_model_path):
    from engine import LLM
    from engine.outputs import FinishedEvent

    bridge = EngineBridge(llm_factory=lambda source, config=None, progress=None: LLM(
        str(tiny_model_path), num_gpu_blocks=64))
    with qtbot.waitSignal(bridge.modelLoaded, timeout=30000):
        bridge.load_model("tiny")
    activity, busy = [], []
    bridge.activityChanged.connect(activity.append)
    bridge.busyChanged.connect(busy.append)
    done = threading.Event()
    # As the serve switch's API does: straight to the worker, past the bridge's handles.
    bridge.worker.submit([1, 2, 3], SamplingParams(max_tokens=8, ignore_eos=True),
                         lambda e: isinstance(e, FinishedEvent) and done.set(), label="api")
    qtbot.waitUntil(lambda: activity == [True, False], timeout=30000)
    assert done.is_set() and busy == [] and not bridge.active
    # The app's own request: active from the submit, idle once the engine is.
    with qtbot.waitSignal(bridge.requestFinished, timeout=30000):
        bridge.submit([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=4))
        assert bridge.active and activity == [True, False, True]
    qtbot.waitUntil(lambda: activity == [True, False, True, False], timeout=30000)
    assert busy == [True, False]
    bridge.shutdown()
