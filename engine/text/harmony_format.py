"""gpt-oss's "harmony" turn format as a Jinja chat template, for a gpt-oss file that carries
no ``tokenizer.chat_template``.

Every message is ``<|start|>{author}<|channel|>{channel} to={recipient} {type}<|message|>
{body}<|end|>`` with the parts that apply (OpenAI's harmony renderer writes them in that
order). The conversation opens with the system message the renderer builds (identity,
knowledge cutoff, ``Reasoning: {reasoning_effort}``, the valid channels, and with tools the
line that sends calls to ``commentary``); the chat's own system messages become the
developer message's ``# Instructions``, and the tools its ``# Tools`` section in the
TypeScript-like ``namespace functions { ... }`` the model was trained on. No "Current
date" line: a prompt that changed every day would miss the prefix and disk caches of every
chat reopened on another day.

Earlier replies are their ``final`` message only: harmony drops an answered turn's
``analysis``, and keeps it (``reasoning_content``) before the calls of the turn still in
progress, after the last user message, where the model reads its own plan on. An
assistant's calls are ``commentary`` messages to ``functions.NAME`` in JSON, ended by
``<|call|>``, and each result a ``functions.NAME to=assistant`` message (its name from
the call it answers). The last message of a rendered chat without a
generation prompt ends ``<|return|>``, as a finished reply does (the engine reads the end
of a turn there); the generation prompt is ``<|start|>assistant``, so the model chooses
the channel.
"""

from __future__ import annotations

# The renderer's system message: identity and cutoff, then the effort, then the channels.
_SYSTEM = (
    "{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by "
    "OpenAI.\\nKnowledge cutoff: 2024-06\\n\\nReasoning: ' }}"
    "{{- reasoning_effort if reasoning_effort is defined and reasoning_effort else 'medium' }}"
    "{{- '\\n\\n# Valid channels: analysis, commentary, final. Channel must be included "
    "for every message.' }}"
    "{%- if tools %}{{- \"\\nCalls to these tools must go to the commentary channel: "
    "'functions'.\" }}{%- endif %}"
    "{{- '<|end|>' }}"
)

# A JSON schema as the TypeScript-like type the tools section shows: objects one property
# a line (its description a comment above it, ``?`` when not required, the default a
# comment after it; an enum's unquoted), string enums as unions of literals, arrays as
# ``T[]`` (``s['items']``: ``s.items`` is the mapping's method).
_TYPES = (
    "{%- macro ts_type(s, indent) -%}"
    "{%- if s.type is defined and s.type is not string and s.type is iterable -%}"
    "{%- for t in s.type -%}{{- ' | ' if not loop.first }}"
    "{{- 'number' if t == 'integer' else t }}{%- endfor -%}"
    "{%- elif s.enum is defined and s.enum -%}"
    "{%- for v in s.enum -%}{{- ' | ' if not loop.first }}{{- v | tojson }}{%- endfor -%}"
    "{%- elif s.anyOf is defined or s.oneOf is defined -%}"
    "{%- for v in (s.anyOf if s.anyOf is defined else s.oneOf) -%}"
    "{{- ' | ' if not loop.first }}{{- ts_type(v, indent) }}{%- endfor -%}"
    "{%- elif s.type == 'object' -%}"
    "{{- '{\\n' }}"
    "{%- for key, value in (s.properties or {}).items() -%}"
    "{%- if value.description is defined -%}"
    "{{- indent ~ '// ' ~ value.description ~ '\\n' }}{%- endif -%}"
    "{{- indent ~ key ~ ('' if key in (s.required or []) else '?') ~ ': ' }}"
    "{{- ts_type(value, indent ~ '    ') ~ ',' }}"
    "{%- if value.default is defined -%}"
    "{{- ' // default: ' ~ (value.default if value.enum is defined and value.default is "
    "string else value.default | tojson) }}{%- endif -%}"
    "{{- '\\n' }}"
    "{%- endfor -%}"
    "{{- indent ~ '}' }}"
    "{%- elif s.type == 'array' -%}"
    "{{- (ts_type(s['items'], indent) if s['items'] is defined else 'any') ~ '[]' }}"
    "{%- elif s.type in ('number', 'integer') -%}{{- 'number' }}"
    "{%- elif s.type in ('string', 'boolean', 'null') -%}{{- s.type }}"
    "{%- else -%}{{- 'any' }}{%- endif -%}"
    "{%- endmacro -%}"
)

# The developer message: the chat's system messages as instructions, then the tools.
_DEVELOPER = (
    "{%- set ns = namespace(instructions='') %}"
    "{%- for m in messages if m.role == 'system' %}"
    "{%- set ns.instructions = ns.instructions ~ ('\\n\\n' if ns.instructions else '') "
    "~ m.content %}{%- endfor %}"
    "{%- if ns.instructions or tools %}"
    "{{- '<|start|>developer<|message|>' }}"
    "{%- if ns.instructions %}{{- '# Instructions\\n\\n' ~ ns.instructions }}"
    "{{- '\\n\\n' if tools }}{%- endif %}"
    "{%- if tools %}"
    "{{- '# Tools\\n\\n## functions\\n\\nnamespace functions {\\n\\n' }}"
    "{%- for tool in tools %}{%- set f = tool.function if tool.function is defined "
    "else tool %}"
    "{%- for line in (f.description or '').split('\\n') if f.description %}"
    "{{- '// ' ~ line ~ '\\n' }}{%- endfor %}"
    "{%- if f.parameters is defined and f.parameters and f.parameters.properties %}"
    "{{- 'type ' ~ f.name ~ ' = (_: ' ~ ts_type(f.parameters, '') ~ ') => any;\\n\\n' }}"
    "{%- else %}{{- 'type ' ~ f.name ~ ' = () => any;\\n\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{{- '} // namespace functions' }}"
    "{%- endif %}"
    "{{- '<|end|>' }}"
    "{%- endif %}"
)

# The conversation: user turns, replies as their final message, calls and their results;
# the turn in progress (after the last user message) keeps its calls' reasoning.
_TURNS = (
    "{%- set turn = namespace(start=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set turn.start = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- set last = loop.last and not add_generation_prompt %}"
    "{%- if m.role == 'user' %}"
    "{{- '<|start|>user<|message|>' ~ m.content ~ '<|end|>' }}"
    "{%- elif m.role == 'assistant' and m.tool_calls is defined and m.tool_calls %}"
    "{%- if m.reasoning_content is defined and m.reasoning_content "
    "and loop.index0 > turn.start %}"
    "{{- '<|start|>assistant<|channel|>analysis<|message|>' ~ m.reasoning_content "
    "~ '<|end|>' }}{%- endif %}"
    "{%- if m.content %}"
    "{{- '<|start|>assistant<|channel|>commentary<|message|>' ~ m.content ~ '<|end|>' }}"
    "{%- endif %}"
    "{%- for call in m.tool_calls %}{%- set f = call.function if call.function is defined "
    "else call %}"
    "{{- '<|start|>assistant<|channel|>commentary to=functions.' ~ f.name }}"
    "{{- ' <|constrain|>json<|message|>' }}"
    "{{- f.arguments if f.arguments is string else (f.arguments | tojson) }}"
    "{{- '<|call|>' }}"
    "{%- endfor %}"
    "{%- elif m.role == 'assistant' %}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' ~ m.content }}"
    "{{- '<|return|>' if last else '<|end|>' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- set found = namespace(name=m.name if m.name is defined and m.name else '') %}"
    "{%- for earlier in messages[:loop.index0] if not found.name "
    "and earlier.tool_calls is defined and earlier.tool_calls %}"
    "{%- for call in earlier.tool_calls if call.id == m.tool_call_id %}"
    "{%- set found.name = (call.function if call.function is defined else call).name %}"
    "{%- endfor %}{%- endfor %}"
    "{%- if not found.name %}{{- raise_exception('a tool result answers a call that no "
    "earlier assistant message made (tool_call_id ' ~ m.tool_call_id ~ ')') }}{%- endif %}"
    "{{- '<|start|>functions.' ~ found.name ~ ' to=assistant<|channel|>commentary"
    "<|message|>' ~ m.content ~ '<|end|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)

HARMONY = _TYPES + _SYSTEM + _DEVELOPER + _TURNS
