"""Chat templates that show reasoning, after the real ones' conventions, and tiny models
that carry them (the tool tests' byte-level tokenizers, so every marker is one token).

``THINK_TEMPLATE`` is Qwen 3's way: the model writes ``<think>…</think>`` itself, the
``enable_thinking`` switch off writes an empty one into the prompt, and earlier replies
are shown without their thinking. ``HARMONY_TEMPLATE`` is gpt-oss's message framing
(``<|start|>assistant<|channel|>final<|message|>…``), its markers special tokens.
"""

from __future__ import annotations

from pathlib import Path

from tests.engine.tools.tool_models import save_tool_model

THINK_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- set content = message.content %}"
    "{%- if message.role == 'assistant' and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
HARMONY_TOKENS = ["<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                  "<|constrain|>", "<|return|>", "<|call|>"]
HARMONY_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + message.content }}"
    "{{- '<|return|>' if loop.last and not add_generation_prompt else '<|end|>' }}"
    "{%- else %}{{- '<|start|>' + message.role + '<|message|>' + message.content + "
    "'<|end|>' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)


def save_thinking_model(path: Path) -> Path:
    return save_tool_model(path, "qwen3", THINK_TEMPLATE)


def save_harmony_format_model(path: Path) -> Path:
    """A model running the engine's own harmony format (what a gpt-oss file without a
    template gets), whose system message reads ``reasoning_effort``."""
    from engine.text.turn_formats import FORMATS

    return save_tool_model(path, "qwen3", FORMATS["harmony"].template,
                           specials=HARMONY_TOKENS, eos="<|return|>")


def save_harmony_model(path: Path) -> Path:
    return save_tool_model(path, "qwen3", HARMONY_TEMPLATE, specials=HARMONY_TOKENS,
                           eos="<|return|>")
