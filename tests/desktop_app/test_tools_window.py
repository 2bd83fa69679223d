"""MCP tools in the real window, offscreen: real MCP servers (a stdio process written with
the SDK's server API, and the same tools over Streamable HTTP on loopback), the real engine
on a tiny Qwen-family model whose replies the test scripts at the sampler, so the model
"decides" to call a tool; the call waits on its card for Run, runs, and its result goes
back into the same turn's next reply."""

from __future__ import annotations

import json
import logging

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPushButton

from desktop_app.data import tool_records
from desktop_app.data.settings import AppSettings, ChatSettings
from desktop_app.widgets.tool_card import ToolCallCard
from tests.desktop_app.mcp.mcp_servers import serve_http, stdio_entry
from tests.engine.tools.tool_models import ScriptedSampler, save_tool_model

TURN_MS = 60_000
SECRET = "hunter2-secret-value"


def call_text(name: str, arguments: dict) -> str:
    """A Qwen (Hermes) tool call, as the model writes it."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


class Replies(ScriptedSampler):
    """A ScriptedSampler whose next replies can be queued: each new request takes the next
    one (then ``script``), so a turn that continues by itself says something new."""

    def __init__(self, end_token: int) -> None:
        super().__init__(end_token)
        self.queue: list[list[int]] = []
        self._scripts: dict[int, list[int]] = {}

    def __call__(self, logits, rows) -> list[int]:
        tokens = []
        for row in rows:
            key = id(row.generator)
            if key not in self._starts:
                self._starts[key] = (row.generator, len(row.token_ids))
                self._scripts[key] = self.queue.pop(0) if self.queue else self.script
            script, done = self._scripts[key], len(row.token_ids) - self._starts[key][1]
            tokens.append(script[done] if done < len(script) else self.end_token)
        return tokens


@pytest.fixture(scope="module")
def tool_llm(tmp_path_factory):
    from engine import LLM

    path = save_tool_model(tmp_path_factory.mktemp("qwen") / "model", "qwen2")
    llm = LLM(str(path), num_gpu_blocks=256, max_model_len=2048)
    llm.engine.sampler = Replies(llm.tokenizer.end_of_turn_token_id)
    return llm, llm.engine.sampler


@pytest.fixture(scope="module")
def harmony_llm(tmp_path_factory):
    """A tiny gpt-oss GGUF without a template: the harmony format renders its chats."""
    from engine import LLM
    from tests.engine.harmony_gguf import write_harmony_gguf

    path = write_harmony_gguf(tmp_path_factory.mktemp("gpt-oss") / "gpt-oss.gguf")
    llm = LLM(str(path), num_gpu_blocks=256, max_model_len=1024)
    llm.engine.sampler = Replies(llm.tokenizer.end_of_turn_token_id)
    return llm, llm.engine.sampler


@pytest.fixture
def tools_window(request, qtbot, make_window, folio_dirs):
    """The window on the tiny tool model (or the model fixture named by an indirect
    parameter) with the test servers in mcp.json; returns (window, say) where say(text)
    scripts the model's next replies."""
    from desktop_app.services.engine_bridge import EngineBridge

    llm, sampler = request.getfixturevalue(getattr(request, "param", "tool_llm"))
    made = []

    def make(servers: dict, **chat):
        config = folio_dirs[1]
        config.mkdir(parents=True, exist_ok=True)
        (config / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
        bridge = EngineBridge(llm_factory=lambda *a, **k: llm)
        with qtbot.waitSignal(bridge.modelLoaded, timeout=30_000):
            bridge.load_model("tool-model")
        made.append(bridge)
        defaults = dict(max_tokens=200, temperature=0.0, tools={name: None for name in servers})
        defaults.update(chat)
        window = make_window(bridge, AppSettings(chat_defaults=ChatSettings(**defaults)))
        qtbot.waitUntil(lambda: set(window.tools.known_tools) == set(servers), timeout=30_000)
        prompts = []
        submit = bridge.submit
        bridge.submit = lambda prompt, params: (prompts.append(prompt.ids),
                                               submit(prompt, params))[1]
        window.prompts = prompts

        def say(text: str, *then: str) -> None:
            sampler.script = llm.tokenizer.encode(text, add_special_tokens=False)
            sampler.queue = [llm.tokenizer.encode(t, add_special_tokens=False) for t in
                             (text, *then)] if then else []

        return window, say

    yield make
    for bridge in made:
        bridge.shutdown()


def send(qtbot, window, text: str) -> None:
    window.conversation.composer.setPlainText(text)
    errors = []
    window.controller.errorRaised.connect(lambda title, message: errors.append(message))
    finished = []
    window.controller.turnFinished.connect(finished.append)
    qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(errors or finished), timeout=TURN_MS)
    assert not errors, errors


def cards(window) -> list[ToolCallCard]:
    return [r for r in window.conversation.rows() if r.objectName() == "toolCallCard"]


def click(qtbot, card: ToolCallCard, name: str, window) -> None:
    button = card.findChild(QPushButton, name)
    qtbot.waitUntil(button.isVisible, timeout=5_000)  # rows show once the loop runs
    assert button.isEnabled()
    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_MS):
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def branch(window):
    store = window.store
    return store.path_to(store.active_leaf(window.controller.chat_id))


def prompt_text(window, i: int) -> str:
    return window.bridge.tokenizer.hf.decode(window.prompts[i])


def test_a_call_waits_for_run_then_its_result_goes_back_and_the_reply_goes_on(
        qtbot, tools_window):
    window, say = tools_window({"demo": stdio_entry()})
    say(call_text("add", {"a": 2, "b": 40}))
    send(qtbot, window, "What is 2 + 40?")
    user, reply, tool = branch(window)
    assert reply.tool_calls == [{"id": reply.tool_calls[0]["id"], "name": "add",
                                 "arguments": '{"a": 2, "b": 40}'}]
    assert "<tool_call>" not in reply.content
    assert tool.role == "tool" and tool.tool_call["state"] == tool_records.PENDING
    assert '"name": "add"' in prompt_text(window, 0)  # the tools were in the prompt
    [card] = cards(window)
    assert card.view.name == "add" and card.view.server == "demo"
    assert card.arguments.toPlainText() == '{\n  "a": 2,\n  "b": 40\n}'
    say("The sum is 42.")
    click(qtbot, card, "toolRunButton", window)
    user, reply, tool, final = branch(window)
    assert (tool.content, tool.tool_call["state"]) == ("42", tool_records.DONE)
    assert final.role == "assistant" and final.content == "The sum is 42."
    assert "<tool_response>\n42\n</tool_response>" in prompt_text(window, 1)
    # The continued reply's prompt starts with the first prompt and the call, exactly:
    # the prefix cache holds all of it but the last partial block.
    earlier = window.prompts[0] + reply.token_ids
    assert window.prompts[1][:len(earlier)] == earlier
    assert final.metrics["num_cached_tokens"] >= 0.9 * len(earlier)
    [card] = cards(window)
    qtbot.waitUntil(card.isVisible, timeout=5_000)
    assert card.result.toPlainText() == "42" and not card.body.isVisible()  # folded
    card.toggle.click()
    assert card.body.isVisible()


@pytest.mark.parametrize("tools_window", ["harmony_llm"], indirect=True)
def test_a_gpt_oss_call_in_its_channels_runs_and_the_turn_goes_on(qtbot, tools_window):
    # Room for the tools' block within the tiny model's 1,024 tokens: the planner counts
    # the prompt the engine runs, tools included.
    window, say = tools_window({"demo": stdio_entry()}, max_tokens=100)
    say("<|channel|>analysis<|message|>I add them.<|end|><|start|>assistant<|channel|>"
        'commentary to=functions.add <|constrain|>json<|message|>{"a": 2, "b": 40}<|call|>')
    send(qtbot, window, "What is 2 + 40?")
    user, reply, tool = branch(window)
    assert reply.thinking == "I add them." and reply.content == ""
    assert [(c["name"], c["arguments"]) for c in reply.tool_calls] == [
        ("add", '{"a": 2, "b": 40}')]
    assert "namespace functions {" in prompt_text(window, 0)
    say("<|channel|>final<|message|>The sum is 42.<|return|>")
    click(qtbot, cards(window)[0], "toolRunButton", window)
    *_, tool, final = branch(window)
    assert (tool.content, final.content) == ("42", "The sum is 42.")
    # The call's turn goes on with its reasoning, the call and harmony's result message.
    assert ("<|start|>assistant<|channel|>analysis<|message|>I add them.<|end|><|start|>"
            "assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>"
            ) in prompt_text(window, 1)
    assert ("<|start|>functions.add to=assistant<|channel|>commentary<|message|>42<|end|>"
            "<|start|>assistant") in prompt_text(window, 1)


def test_a_denied_call_tells_the_model_and_always_allow_runs_without_asking(
        qtbot, tools_window):
    window, say = tools_window({"demo": stdio_entry()})
    say(call_text("add", {"a": 1, "b": 1}))
    send(qtbot, window, "1 + 1?")
    say("You said no.")
    click(qtbot, cards(window)[0], "toolDenyButton", window)
    *_, tool, final = branch(window)
    assert tool.tool_call["state"] == tool_records.DENIED and final.content == "You said no."
    assert tool_records.DENIED_TEXT in prompt_text(window, 1)

    say(call_text("add", {"a": 5, "b": 5}))
    send(qtbot, window, "5 + 5?")
    say("Ten.")
    click(qtbot, cards(window)[-1], "toolAlwaysButton", window)
    assert window.settings.always_allowed_tools == ["demo/add"]
    assert branch(window)[-2].content == "10"
    # Always allowed: the next call runs at once, and the turn goes on by itself.
    say(call_text("add", {"a": 3, "b": 4}), "Seven.")
    window.conversation.composer.setPlainText("3 + 4?")
    qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: branch(window)[-1].content == "Seven."
                    and branch(window)[-1].status == "complete", timeout=TURN_MS)
    assert branch(window)[-2].content == "7"


def test_a_server_that_exits_mid_call_shows_on_the_card_and_in_settings_and_the_chat_goes_on(
        qtbot, tools_window):
    window, say = tools_window({"demo": stdio_entry()})
    say(call_text("crash", {}))
    send(qtbot, window, "Crash it.")
    say("The tool failed.")
    click(qtbot, cards(window)[0], "toolRunButton", window)
    *_, tool, final = branch(window)
    assert tool.tool_call["state"] == tool_records.ERROR
    assert "the server exited during the call" in tool.content
    assert final.content == "The tool failed."
    card = cards(window)[0]
    qtbot.waitUntil(card.isVisible, timeout=5_000)
    assert card.view.state == "error" and card.body.isVisible()
    dialog = window.open_settings()
    page = dialog.findChild(object, "toolsSettings")
    qtbot.waitUntil(lambda: "failed" in page.servers.item(0).text(), timeout=10_000)
    assert "exited" in page.servers.item(0).text()
    dialog.reject()


def test_a_call_past_the_timeout_fails_on_its_card(qtbot, tools_window):
    window, say = tools_window({"slow": stdio_entry(timeout=0.5)})
    say(call_text("sleep", {"seconds": 5}))
    send(qtbot, window, "Sleep.")
    say("Too slow.")
    click(qtbot, cards(window)[0], "toolRunButton", window)
    *_, tool, final = branch(window)
    assert tool.tool_call["state"] == tool_records.ERROR
    assert "no answer within 0.5 s" in tool.content and final.content == "Too slow."


def test_streamable_http_server_and_secrets_stay_out_of_chats_exports_and_logs(
        qtbot, tools_window, caplog):
    caplog.set_level(logging.DEBUG)
    with serve_http(required_header=("Authorization", f"Bearer {SECRET}")) as url:
        window, say = tools_window({
            "web": {"url": url, "headers": {"Authorization": f"Bearer {SECRET}"}},
            "local": stdio_entry(env={"DEMO_TOKEN": SECRET})},
            # A token per character (the byte-level tokenizer): two tools fit the context.
            tools={"web": ["add"], "local": ["token"]})
        say(call_text("add", {"a": 20, "b": 22}))
        send(qtbot, window, "20 + 22 on the web?")
        say("42 it is.")
        click(qtbot, cards(window)[0], "toolRunButton", window)
        assert branch(window)[-2].content == "42"
        say(call_text("token", {}))
        send(qtbot, window, "Your token?")
        say("Hidden.")
        click(qtbot, cards(window)[-1], "toolRunButton", window)
        assert branch(window)[-2].content == "token is •••"
        exported = window.store.export_json(window.controller.chat_id)
        markdown = window.store.export_markdown(window.controller.chat_id)
        for text in (exported, markdown, caplog.text, *map(prompt_text, [window] * 4,
                                                           range(4))):
            assert SECRET not in text


def test_candidates_calls_run_only_once_kept(qtbot, tools_window):
    window, say = tools_window({"demo": stdio_entry()}, num_candidates=2)
    say(call_text("add", {"a": 2, "b": 2}))
    send(qtbot, window, "2 + 2?")
    store = window.store
    group = [m for m in store.siblings(branch(window)[-1].id)]
    assert len(group) == 2 and all(m.tool_calls for m in group)
    assert all(store.children(m.id) == [] for m in group)  # nothing runs before Keep
    column = window.conversation.widget_for(group[1].id)
    assert "`add`" in column.text() and "Keep this candidate" in column.text()
    say("Four.")
    window.controller.keep(group[1].id)
    [card] = cards(window)
    assert store.children(group[0].id) == []
    click(qtbot, card, "toolRunButton", window)
    user, kept, tool, final = branch(window)
    assert kept.id == group[1].id and tool.content == "4" and final.content == "Four."


def test_the_chats_tools_menu_turns_servers_and_tools_on_and_off(qtbot, tools_window):
    window, say = tools_window({"demo": stdio_entry()}, tools={})
    window.new_chat()
    button = window.tools_button
    assert button.text() == "Tools"
    button.action("toolServer:demo").trigger()
    chat = window.store.get_chat(window.controller.chat_id)
    assert chat.settings.tools == {"demo": None}
    button.action("tool:demo/crash").trigger()
    chat = window.store.get_chat(window.controller.chat_id)
    assert "crash" not in chat.settings.tools["demo"] and "add" in chat.settings.tools["demo"]
    assert button.text() == f"Tools ({len(window.tools.known_tools['demo']) - 1})"
    # A tool that is off is not in the prompt.
    say("No tools needed.")
    send(qtbot, window, "Hello")
    assert '"name": "crash"' not in prompt_text(window, 0)
    assert '"name": "add"' in prompt_text(window, 0)


def test_settings_tools_page_applies_mcp_json_and_names_a_bad_field(qtbot, tools_window):
    window, _ = tools_window({})
    dialog = window.open_settings()
    page = dialog.findChild(object, "toolsSettings")
    assert page is dialog.tools_page and page.servers.count() == 0
    page.editor.setPlainText('{"mcpServers": {"x": {"command": "a", "args": "b"}}}')
    page.apply_button.click()
    assert "mcpServers.x.args" in page.error.text()
    assert window.tools.config.servers == ()  # refused: nothing changed
    page.editor.setPlainText(json.dumps({"mcpServers": {"demo": stdio_entry()}}))
    page.apply_button.click()
    assert page.error.text() == ""
    qtbot.waitUntil(lambda: page.servers.count() == 1
                    and "ready" in page.servers.item(0).text(), timeout=30_000)
    assert "add" in page.servers.item(0).text()
    assert json.loads(window.tools.path.read_text())["mcpServers"]["demo"] == stdio_entry()
    # The chat's Tools menu lists the new server.
    assert window.tools_button.action("toolServer:demo") is not None
    dialog.reject()
