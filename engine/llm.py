"""LLM: the blocking API on top of LLMEngine (``generate`` and ``chat``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from engine.config import EngineConfig
from engine.core.kv_stats import KVStats
from engine.llm_engine import LLMEngine, Prompt
from engine.runner.memory import MemoryStats
from engine.outputs import FinishedEvent, RequestOutput
from engine.sampling_params import SamplingParams


class LLM:
    """``LLM("starter")``, a model folder, a ``.gguf`` file, or a repo id in the local
    Hugging Face cache."""

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

    @property
    def tokenizer(self):
        return self.engine.tokenizer

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
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int | dict)):
            prompts = [prompts]
        ids = [self.engine.add_request(p, params) for p in prompts]
        return self._run(ids)

    def chat(
        self, messages: list[dict], params: SamplingParams | None = None
    ) -> RequestOutput:
        """One reply to a conversation. Assistant messages may carry ``token_ids``, the
        exact ids the model produced, so the earlier turns hit the prefix cache."""
        return self._run([self.engine.add_request(messages, params)])[0]

    def _run(self, request_ids: list[str]) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        try:
            while len(done) < len(request_ids):
                for event in self.engine.step():
                    if isinstance(event, FinishedEvent):
                        done[event.request_id] = event.output
        except BaseException:
            for request_id in request_ids:
                if request_id not in done:
                    self.engine.abort(request_id)
            raise
        return [done[r] for r in request_ids]

    def kv_stats(self) -> KVStats:
        return self.engine.kv_stats()

    def memory_stats(self) -> MemoryStats:
        return self.engine.memory_stats()
