"""The context planner measures a branch with the engine's prompt builder and submits the
prompt it measured: its count is the length of the ids the engine runs, with thinking on
and off, tools on and off, and a branch the overflow policy cut."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from desktop_app.controllers.context_window import ContextTracker
from desktop_app.data.chat_store import ChatStore
from desktop_app.data.context_policy import KEEP_LATEST
from desktop_app.data.settings import ChatSettings
from engine import LLM, SamplingParams
from engine.chat import ChatRequest
from engine.text.reasoning.options import TemplateOptions
from engine.tools.request import ToolRequest, tool_request
from tests.engine.text.reasoning.thinking_models import THINK_TEMPLATE
from tests.engine.tools.tool_models import HERMES_TEMPLATE, WEATHER_TOOL, save_tool_model

# Qwen 3's ways at once: tools in a system block, thinking dropped from earlier replies,
# the enable_thinking switch.
TEMPLATE = HERMES_TEMPLATE.replace(
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    THINK_TEMPLATE[THINK_TEMPLATE.index("{%- if add_generation_prompt %}"):])


@dataclass
class Bridge:
    """What the planner reads of the app's bridge."""

    prompts: object
    max_model_len: int


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = save_tool_model(tmp_path_factory.mktemp("qwen") / "model", "qwen3", TEMPLATE)
    return LLM(str(path), num_gpu_blocks=256, max_model_len=2048)


@pytest.fixture
def store(tmp_path):
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def a_chat(store, turns: int) -> tuple[int, int]:
    """A chat with a system prompt and ``turns`` answered turns, the replies thinking."""
    chat = store.create_chat("c", ChatSettings(system_prompt="Be brief.", max_tokens=8,
                                               overflow_policy=KEEP_LATEST))
    parent = None
    for k in range(turns):
        user = store.add_message(chat.id, parent, "user", f"Question {k}: " + "word " * 20)
        reply = store.add_message(chat.id, user.id, "assistant", f"Answer {k}.")
        store.finish_message(reply.id, f"Answer {k}.", thinking=f"Thought {k}.")
        parent = reply.id
    return chat.id, parent


@pytest.mark.parametrize("thinking", [None, True, False])
@pytest.mark.parametrize("tools", [False, True])
@pytest.mark.parametrize("cut", [False, True])
def test_the_count_is_the_ids_the_engine_runs(llm, store, thinking, tools, cut):
    chat_id, leaf = a_chat(store, 4)
    # The whole chat is about 650 tokens, the tools' block about 400 more.
    context = (900 if tools else 500) if cut else 2048
    request_tools = (tool_request([WEATHER_TOOL], "auto", None) if tools else ToolRequest())

    def request_for(messages):
        return ChatRequest(messages, request_tools, TemplateOptions(thinking))

    plan = ContextTracker().plan(store, Bridge(llm.prompts, context), chat_id, leaf,
                                 "And now?", request_for)
    assert plan.refused is None and plan.prompt is not None
    assert plan.cut == cut
    output = llm.generate(plan.prompt, SamplingParams(max_tokens=1, temperature=0))[0]
    assert plan.prompt_tokens == len(plan.prompt.ids) == output.metrics.num_prompt_tokens
    assert output.prompt_token_ids == plan.prompt.ids
    # The prompt is the one built for the messages the plan sends, with the chat's tools
    # and switch: measured once, run as measured.
    assert plan.prompt.request.messages == tuple(plan.messages)
    assert (plan.prompt.request.tools, plan.prompt.request.options) == (
        request_tools, TemplateOptions(thinking))
