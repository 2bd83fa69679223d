"""The families' own turn formats, for a model file that carries no chat template, and the
check a template must pass before a user's choice of one is kept.

A GGUF converted without ``tokenizer.chat_template`` (a real Gemma 3 270M Q4_K_M is one)
would otherwise be prompted as plain ``user: ...`` lines, which an instruction-tuned model
answers by rambling about "User:". Each family in ``engine.models.registry`` names its
format (``ModelFamily.turn_format``); ``chat_template_for`` picks the file's template, a
user's choice, or that format, as llama.cpp and LM Studio fall back to a known preset.

Each format is written so that the text before an assistant reply is exactly its
generation prompt (a reply's ids splice into the next turn's prompt: prefix reuse).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import jinja2

from engine.text.harmony_format import HARMONY
from engine.text.template_render import render_chat


@dataclass(slots=True, frozen=True)
class TurnFormat:
    name: str  # the key families name it by
    label: str  # what the models dialog shows
    marker: str  # a special token of the format: a vocabulary without it cannot run it
    template: str  # Jinja, read as transformers reads chat templates


# Gemma 2 / 3: no system role, so a system message opens the first user turn.
_GEMMA = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for m in messages %}{% if m.role == 'system' %}"
    "{% set ns.system = ns.system + m.content + '\\n\\n' %}"
    "{% elif m.role == 'assistant' %}<start_of_turn>model\n{{ m.content }}<end_of_turn>\n"
    "{% else %}<start_of_turn>user\n{{ ns.system }}{{ m.content }}<end_of_turn>\n"
    "{% set ns.system = '' %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
_GEMMA4 = (
    "{{ bos_token }}{% for m in messages %}"
    "<|turn>{{ 'model' if m.role == 'assistant' else m.role }}\n{{ m.content }}<turn|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}")
_LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}"
    "<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>"
    "\n\n{{ m.content }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% endif %}")
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_PHI3 = (
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
# Mistral: [INST] user [/INST] reply</s>; a system message joins the next user message.
_MISTRAL = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for m in messages %}{% if m.role == 'system' %}"
    "{% set ns.system = ns.system + m.content + '\\n\\n' %}"
    "{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}"
    "{% else %}[INST] {{ ns.system }}{{ m.content }} [/INST]{% set ns.system = '' %}"
    "{% endif %}{% endfor %}")

FORMATS: Mapping[str, TurnFormat] = {f.name: f for f in (
    TurnFormat("gemma", "Gemma", "<start_of_turn>", _GEMMA),
    TurnFormat("gemma4", "Gemma 4", "<|turn>", _GEMMA4),
    TurnFormat("llama3", "Llama 3", "<|start_header_id|>", _LLAMA3),
    TurnFormat("chatml", "ChatML", "<|im_start|>", CHATML),
    TurnFormat("phi3", "Phi-3", "<|user|>", _PHI3),
    TurnFormat("mistral", "Mistral", "[INST]", _MISTRAL),
    TurnFormat("harmony", "Harmony", "<|channel|>", HARMONY),
)}
# Where the vocabulary lacks the family's markers: the first format it has them for,
# ChatML last (llama.cpp's own fallback).
_ORDER = ("llama3", "gemma4", "gemma", "harmony", "phi3", "mistral", "chatml")
# Harmony ends a reply at a call as well as at its end (<|call|>, <|return|>): a template
# that writes its channels stops on both, whoever wrote it.
HARMONY_STOPS = ("<|call|>", "<|return|>")

# Where a loaded model's template came from (ChatTokenizer.template_source).
FROM_FILE, FROM_FAMILY, FROM_USER = "file", "family", "user"


def family_format(turn_format: str, vocab: Mapping[str, int] | None = None) -> TurnFormat:
    """The family's format when the vocabulary has its marker (or no vocabulary is
    given), else the first known format whose marker it has, else ChatML."""
    own = FORMATS[turn_format]
    if vocab is None or own.marker in vocab:
        return own
    return next((FORMATS[n] for n in _ORDER if FORMATS[n].marker in vocab), FORMATS["chatml"])


def chat_template_for(file_template: str | None, turn_format: str,
                      vocab: Mapping[str, int], choice: str | None = None) -> tuple[str, str]:
    """(template, where it came from): the user's ``choice`` (a Jinja text) when set,
    else the file's own, else the family's format."""
    if choice:
        return choice, FROM_USER
    if file_template:
        return file_template, FROM_FILE
    return family_format(turn_format, vocab).template, FROM_FAMILY


def stop_tokens(template: str | None, vocab: Mapping[str, int]) -> list[int]:
    """Tokens beyond end-of-text that end a reply in the template's format."""
    if not template or "<|channel|>" not in template:
        return []
    return [vocab[t] for t in HARMONY_STOPS if t in vocab]


TWO_TURNS = ({"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi!"},
             {"role": "user", "content": "How are you?"})


def check_template(template: str, bos_token: str = "<s>", eos_token: str = "</s>") -> str:
    """The template rendered over a two-turn chat (with its generation prompt), as the
    engine will render it; ValueError naming ``chat_template`` and the render error when
    it fails or renders nothing of the messages."""
    if not isinstance(template, str) or not template.strip():
        raise ValueError("chat_template: the template is empty")
    try:
        text = render_chat(template, list(TWO_TURNS), add_generation_prompt=True,
                           bos_token=bos_token, eos_token=eos_token)
    except jinja2.TemplateError as exc:
        where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        raise ValueError(f"chat_template: it does not render a two-turn chat{where}: "
                         f"{exc}") from exc
    missing = [m["content"] for m in TWO_TURNS if m["content"] not in text]
    if missing:
        raise ValueError(f"chat_template: its two-turn chat leaves out {missing[0]!r}; a "
                         "template must write every message")
    return text

