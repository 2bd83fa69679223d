"""One reading of a reply, two consumers: the engine reads each recorded model output
(a reply with thinking, two tool calls in each family's format, a harmony reply) once,
and the same typed events, replayed to the app's controller and to the server's response
builder, give the same answer, thinking and calls in both."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading

import pytest
from PySide6.QtCore import Qt

from desktop_app.services.worker_protocol import ModelFacts
from engine import LLM, SamplingParams
from engine.chat import ChatRequest
from engine.outputs import FinishedEvent, TokenEvent
from engine.serve import responses
from engine.serve.logprobs import TokenTexts
from engine.tools.request import tool_request
from tests.engine.text.reasoning.thinking_models import save_harmony_model, save_thinking_model
from tests.engine.tools.tool_models import (
    TIME_TOOL,
    TOOL_FAMILIES,
    TWO_CALLS,
    WEATHER_TOOL,
    save_tool_model,
    scripted,
)

THOUGHT, ANSWER = "The user greets me. I greet back.", "Hello! How can I help?"
CASES = {
    "thinking": (save_thinking_model, f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}", False),
    "harmony": (save_harmony_model, f"<|channel|>analysis<|message|>{THOUGHT}<|end|>"
                "<|start|>assistant<|channel|>final<|message|>" + ANSWER, False),
    **{f"calls-{family}": (lambda path, f=family: save_tool_model(path, f), TWO_CALLS[family],
                           True) for family in TOOL_FAMILIES},
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(params=sorted(CASES))
def recorded(request, tmp_path):
    """(the model, what the engine emitted for the case's scripted reply)."""
    save, script, tools = CASES[request.param]
    llm = LLM(str(save(tmp_path / "model")), num_gpu_blocks=256, max_model_len=2048)
    scripted(llm).script = llm.tokenizer.encode(script, add_special_tokens=False)
    chat = ChatRequest(QUESTION, tool_request([WEATHER_TOOL, TIME_TOOL], "auto", None)
                       if tools else tool_request(None, None, None))
    events: list = []
    llm.loop.run([chat], SamplingParams(max_tokens=800, temperature=0), events.append)
    return llm, events


def served(llm, events) -> tuple[dict, dict]:
    """The server's response builder over the events: the message a client assembles from
    the streamed chunks, and the one-piece body's message."""
    shape = responses.Shape("chat", "r", llm.model_name, 0)
    texts = TokenTexts(llm.tokenizer)

    class Replay:
        def __init__(self) -> None:
            self._events = iter(events[1:])

        async def next_event(self):
            return next(self._events)

    async def chunks() -> list[bytes]:
        return [c async for c in responses._chunks(Replay(), events[0], shape, False,
                                                   lambda _: None,
                                                   responses.LogprobsFormat("chat", texts))]

    # Put together as a client does: text and thinking appended, each call's name from
    # its first piece and its arguments from every piece.
    streamed = {"content": "", "thinking": "", "calls": {}}
    for line in asyncio.run(chunks()):
        data = line.decode().removeprefix("data: ").strip()
        for choice in [] if data == "[DONE]" else json.loads(data)["choices"]:
            delta = choice["delta"]
            streamed["content"] += delta.get("content") or ""
            streamed["thinking"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or ():
                name, arguments = streamed["calls"].get(call["index"], ("", ""))
                function = call["function"]
                streamed["calls"][call["index"]] = (name + function.get("name", ""),
                                                    arguments + function["arguments"])
    streamed["calls"] = [streamed["calls"][i] for i in sorted(streamed["calls"])]
    body = responses.completion_body(shape, events[-1].output, texts)["choices"][0]["message"]
    return (streamed,
            {"content": body["content"] or "", "thinking": body.get("reasoning_content") or "",
             "calls": [(c["function"]["name"], c["function"]["arguments"])
                       for c in body.get("tool_calls") or ()]})


class ReplayWorker(ModelFacts):
    """The app's worker (services.worker_protocol.ModelWorker) on ``llm``, replaying the
    recorded events for whatever it is sent."""

    is_remote = False

    def __init__(self, events, llm) -> None:
        self._events, self._ids = events, itertools.count()
        self.llm = llm

    def start(self):
        return self

    def submit(self, prompt, params, on_event):
        request_id = f"replay-{next(self._ids)}"

        def replay() -> None:
            for event in self._events:
                if isinstance(event, TokenEvent | FinishedEvent):
                    event = _renamed(event, request_id)
                on_event(event)

        threading.Thread(target=replay, daemon=True).start()
        return _Handle(request_id)

    def shutdown(self) -> None:
        pass

    def kv_stats(self):  # the memory panel shows none, as for a remote model
        return None

    def memory_stats(self):
        # A local model's figures (the app's ModelShelf counts them against its budget).
        from engine.runner.memory import MemoryStats

        return MemoryStats("cpu", 0, 0, None, None, None, 0)

    def remote_status(self):
        return None

    def cancel(self, request_id: str) -> None:
        pass  # a replay runs to its end

    def preload(self, prompt) -> None:
        pass

    def clear_disk(self) -> None:
        pass

    def set_activity_listener(self, listener) -> None:
        pass


class _Handle:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id

    def cancel(self) -> None:
        pass


def _renamed(event, request_id: str):
    if isinstance(event, TokenEvent):
        return TokenEvent(request_id, event.index, event.text, event.token_ids,
                          event.logprobs, event.parts)
    return FinishedEvent(request_id, event.output)


def shown_by_the_app(qtbot, make_window, llm, events) -> tuple[str, dict]:
    """What the app's view streamed, and the message it stored."""
    from desktop_app.services.engine_bridge import EngineBridge

    bridge = EngineBridge(llm_factory=lambda source, config=None, progress=None: llm,
                          worker_factory=lambda llm_: ReplayWorker(events, llm_))
    with qtbot.waitSignal(bridge.modelLoaded, timeout=30000):
        bridge.load_model("replay")
    window = make_window(bridge)
    streamed: list[str] = []
    window.controller.bridge.tokenArrived.connect(
        lambda rid, index, parts: streamed.extend(
            p.text for p in parts if type(p).__name__ == "TextDelta"))
    window.conversation.composer.setPlainText(QUESTION[0]["content"])
    with qtbot.waitSignal(window.controller.turnFinished, timeout=30000):
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
    store = window.store
    # The reply, not the tool messages its calls opened after it (answered "no tool named
    # ...": this chat has none on) nor the reply that goes on after them.
    path = store.path_to(store.active_leaf(window.controller.chat_id))
    reply = next(m for m in path if m.role == "assistant")
    bridge.shutdown()
    return "".join(streamed), {
        "content": reply.content, "thinking": reply.thinking or "",
        "calls": [(c["name"], c["arguments"]) for c in reply.tool_calls or ()]}


def test_the_app_and_the_server_show_one_reading(qtbot, make_window, recorded):
    llm, events = recorded
    assert isinstance(events[-1], FinishedEvent)
    streamed, whole = served(llm, events)
    app_stream, stored = shown_by_the_app(qtbot, make_window, llm, events)
    assert streamed == whole, (streamed, whole)
    assert whole == stored, (whole, stored)
    assert app_stream == streamed["content"]
    # What each case is about was read at all (a test that could not fail otherwise).
    assert stored["calls"] or stored["thinking"] == THOUGHT
    assert not stored["calls"] or [name for name, _ in stored["calls"]] == [
        "get_weather", "get_time"]
