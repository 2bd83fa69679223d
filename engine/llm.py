"""LLM: the blocking API on top of LLMEngine (``generate`` and ``chat``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from engine.beam.params import BeamSearchParams
from engine.chat import ChatPrompt, ChatRequest
from engine.config import EngineConfig
from engine.core.kv_stats import KVStats
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.requests import Prompt
from engine.runner.memory import MemoryStats
from engine.sampling_params import SamplingParams
from engine.step_loop import StepLoop


class LLM:
    """``LLM("starter")``, a model folder, a ``.gguf`` file, or a repo id in the local
    Hugging Face cache. ``with LLM(...) as llm:`` closes it on exit (LLMEngine.close)."""

    def __init__(
        self,
        model: str | Path = "starter",
        config: EngineConfig | None = None,
        progress: Callable[[str, float], None] | None = None,
        **config_fields,
    ) -> None:
        if config is None:
            config = EngineConfig(**config_fields)
        elif config_fields:
            raise ValueError("pass either config or EngineConfig fields, not both")
        self.engine = LLMEngine(model, config, progress)
        # The one loop that steps this engine: these blocking calls, the CLI and an
        # EngineWorker built on this LLM all go through it.
        self.loop = StepLoop(self.engine)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def prompts(self):
        """The model's prompt builder (engine.chat.PromptBuilder)."""
        return self.engine.prompts

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def generate(
        self,
        prompts: Prompt | list[str] | list[list[int]],
        params: SamplingParams | None = None,
    ) -> list[RequestOutput]:
        """Run all prompts as one batch; outputs come back in the prompts' order."""
        if isinstance(prompts, str | ChatRequest | ChatPrompt) or (
                prompts and isinstance(prompts[0], int | dict)):
            prompts = [prompts]
        return self.loop.run(list(prompts), params)

    def chat(
        self, messages: list[dict] | ChatRequest, params: SamplingParams | None = None
    ) -> RequestOutput:
        """One reply to a conversation (messages, or a ``ChatRequest`` with tools and
        template options). Assistant messages may carry ``token_ids``, the exact ids the
        model produced, so the earlier turns hit the prefix cache. Each candidate's
        ``reply`` holds its answer, thinking and tool calls."""
        return self.loop.run([messages], params)[0]

    def beam_search(
        self, prompts: Prompt | list[str] | list[list[int]], params: BeamSearchParams,
    ) -> list[RequestOutput]:
        """Beam search for each prompt, all of them in one batch (engine/beam); per
        prompt a RequestOutput whose outputs are the finished beams, best first, each
        with its ``cumulative_logprob`` and length-penalized ``score``."""
        if not isinstance(params, BeamSearchParams):
            raise ValueError("beam_search takes BeamSearchParams")
        if isinstance(prompts, str | ChatRequest | ChatPrompt) or (
                prompts and isinstance(prompts[0], int | dict)):
            prompts = [prompts]
        return self.loop.run(list(prompts), params)

    def close(self) -> None:
        """Keep the cached blocks on disk (with the disk tier on); see LLMEngine.close."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def kv_stats(self, with_blocks: bool = True) -> KVStats:
        return self.engine.kv_stats(with_blocks)

    def memory_stats(self) -> MemoryStats:
        return self.engine.memory_stats()
