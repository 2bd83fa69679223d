"""Tiny models of each family that has a tool format, and a sampler that makes them say
what a test scripts.

The real chat templates are not in this repository and the tests download nothing, so
each family gets a template written here after its model card's tool conventions: where
the tools go (Qwen's ``<tools>`` system block, Llama 3.1's first user turn, Mistral's
``[AVAILABLE_TOOLS]`` before the last user turn, Phi-4-mini's ``<|tool|>`` on the system
message), how an earlier call is rendered and how a result comes back. The tokenizers are
byte-level with each family's special tokens, so every marker is one token as in the real
vocabularies.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

HERMES_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call functions. Their signatures are within <tools></tools>:"
    "\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nReturn each call as <tool_call>\\n{\"name\": <name>, "
    "\"arguments\": <args-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}{%- set call = call.function %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' }}"
    "{{- call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- if messages[0].role == 'system' %}"
    "{%- set system = messages[0].content %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools %}{{- 'Environment: ipython\\n' }}{%- endif %}{{- system + '<|eot_id|>' }}"
    "{%- if tools %}{%- set first = messages[0].content %}{%- set messages = messages[1:] %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\nAnswer with a JSON function call: "
    "{\"name\": function name, \"parameters\": dictionary of arguments}.\\n\\n' }}"
    "{%- for t in tools %}{{- (t | tojson(indent=4)) + '\\n\\n' }}{%- endfor %}"
    "{{- first + '<|eot_id|>' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'tool' or 'tool_calls' in message) %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' }}"
    "{{- (message.content | trim) + '<|eot_id|>' }}"
    "{%- elif 'tool_calls' in message %}"
    "{%- if not message.tool_calls | length == 1 %}"
    "{{- raise_exception('This model only supports single tool-calls at once!') }}"
    "{%- endif %}{%- set call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- if builtin_tools is defined and call.name in builtin_tools %}"
    "{{- '<|python_tag|>' + call.name + '.call()<|eom_id|>' }}{%- else %}"
    "{{- '{\"name\": \"' + call.name + '\", \"parameters\": ' }}"
    "{{- (call.arguments | tojson) + '}<|eot_id|>' }}{%- endif %}"
    "{%- else %}{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}"
    "{{- message.content + '<|eot_id|>' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
MISTRAL_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}"
    "{%- set messages = messages[1:] %}{%- endif %}"
    "{%- set users = messages | selectattr('role', 'equalto', 'user') | list %}"
    "{{- bos_token }}{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{%- if tools and message == users[-1] %}{{- '[AVAILABLE_TOOLS] [' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{%- if not loop.last %}{{- ', ' }}"
    "{%- endif %}{%- endfor %}{{- '][/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{%- if message == users[-1] and system is defined %}"
    "{{- '[INST] ' + system + '\\n\\n' + message.content + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message.content + '[/INST]' }}{%- endif %}"
    "{%- elif message.tool_calls is defined %}{{- '[TOOL_CALLS] [' }}"
    "{%- for call in message.tool_calls %}"
    "{%- if call.id | length != 9 %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{%- endif %}{{- '{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{{- (call.function.arguments | tojson) + ', \"id\": \"' + call.id + '\"}' }}"
    "{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}{{- ']' + eos_token }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '[TOOL_RESULTS] {\"content\": ' + (message.content | tojson) }}"
    "{{- ', \"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}"
    "{%- else %}{{- ' ' + message.content + eos_token }}{%- endif %}{%- endfor %}"
)
PHI4_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message "
    "and message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + "
    "message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}"
    "{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}"
    "{% else %}{{ eos_token }}{% endif %}"
)
# family: (config class, template, special tokens, bos, eos, plain added tokens)
FAMILIES = {
    "qwen2": (Qwen2Config, HERMES_TEMPLATE, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
              None, "<|im_end|>", ["<tool_call>", "</tool_call>"]),
    "qwen3": (Qwen3Config, HERMES_TEMPLATE, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
              None, "<|im_end|>", ["<tool_call>", "</tool_call>"]),
    "llama": (LlamaConfig, LLAMA3_TEMPLATE,
              ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
               "<|eom_id|>", "<|python_tag|>"], "<|begin_of_text|>", "<|eot_id|>", []),
    "mistral": (MistralConfig, MISTRAL_TEMPLATE,
                ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                 "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"], "<s>", "</s>", []),
    "phi3": (Phi3Config, PHI4_TEMPLATE,
             ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>",
              "<|tool|>", "<|/tool|>", "<|tool_call|>", "<|/tool_call|>"], None,
             "<|end|>", []),
}
TOOL_FAMILIES = tuple(FAMILIES)


def tool_tokenizer(family: str, template: str | None = None,
                   specials: list[str] | None = None,
                   eos: str | None = None) -> PreTrainedTokenizerFast:
    """``specials`` and ``eos`` replace the family's (another chat format's tokens)."""
    _, default_template, family_specials, bos, family_eos, plain = FAMILIES[family]
    specials, eos = specials or family_specials, eos or family_eos
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for token in specials + plain:
        vocab[token] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(specials)
    core.add_tokens(plain)  # Qwen's <tool_call> is an added token, not a special one
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=bos, eos_token=eos,
                                  pad_token=specials[0])
    tok.chat_template = default_template if template is None else template
    return tok


def save_tool_model(path: Path, family: str, template: str | None = None,
                    **tokens) -> Path:
    config_class = FAMILIES[family][0]
    tokenizer = tool_tokenizer(family, template, **tokens)
    extra = {"head_dim": 16} if family == "qwen3" else {}
    config = config_class(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=2048, tie_word_embeddings=False,
                          bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id, **extra)
    config.architectures = [config_class.__name__.replace("Config", "ForCausalLM")]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


class ScriptedSampler:
    """Stands in for the engine's sampler: every new sequence says ``script`` (token ids),
    then the end-of-turn token. The engine around it (prefill, KV cache, prefix cache,
    detokenizer, stop checks) runs as it does for a real model."""

    def __init__(self, end_token: int) -> None:
        self.end_token = end_token
        self.script: list[int] = []
        self._starts: dict[int, tuple[object, int]] = {}

    def __call__(self, logits, rows) -> list[int]:
        tokens = []
        for row in rows:
            key = id(row.generator)
            if key not in self._starts:  # the generator is the sequence's own
                self._starts[key] = (row.generator, len(row.token_ids))
            done = len(row.token_ids) - self._starts[key][1]
            tokens.append(self.script[done] if done < len(self.script) else self.end_token)
        return tokens


def scripted(llm) -> ScriptedSampler:
    """Replace ``llm``'s sampler with a ScriptedSampler; returns it."""
    tokenizer = llm.tokenizer
    end = tokenizer.end_of_turn_token_id
    sampler = ScriptedSampler(tokenizer.hf.eos_token_id if end is None else end)
    llm.engine.sampler = sampler
    return sampler


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string"}},
                   "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}
ARGUMENTS = '{"city": "Paris", "unit": "celsius"}'
# What a model of each family writes to call get_weather(ARGUMENTS), whole.
CALL_REPLIES = {
    "qwen2": f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGUMENTS}}}\n</tool_call>',
    "qwen3": f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGUMENTS}}}\n</tool_call>',
    "llama": f'{{"name": "get_weather", "parameters": {ARGUMENTS}}}',
    "mistral": f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {ARGUMENTS}}}]',
    "phi3": f'<|tool_call|>[{{"name": "get_weather", "arguments": {ARGUMENTS}}}]<|/tool_call|>',
}
# Two calls in one reply, where the family writes several.
TWO_CALLS = {
    "qwen2": CALL_REPLIES["qwen2"] + '\n<tool_call>\n{"name": "get_time", "arguments": '
             '{"zone": "CET"}}\n</tool_call>',
    "llama": CALL_REPLIES["llama"] + '; {"name": "get_time", "parameters": {"zone": "CET"}}',
    "mistral": f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {ARGUMENTS}}}, '
               '{"name": "get_time", "arguments": {"zone": "CET"}}]',
    "phi3": f'<|tool_call|>[{{"name": "get_weather", "arguments": {ARGUMENTS}}}, '
            '{"name": "get_time", "arguments": {"zone": "CET"}}]<|/tool_call|>',
}
TWO_CALLS["qwen3"] = TWO_CALLS["qwen2"]
# The same call cut short of valid JSON.
BROKEN_REPLIES = {
    "qwen2": '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
    "llama": '{"name": "get_weather", "parameters": {"city" "Paris"}}',
    "mistral": '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris",}}]',
    "phi3": '<|tool_call|>[{"name": "get_weather", "arguments": {"city": ]<|/tool_call|>',
}
BROKEN_REPLIES["qwen3"] = BROKEN_REPLIES["qwen2"]
