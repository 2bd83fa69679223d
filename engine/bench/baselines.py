"""The other side of ``folio bench``: Hugging Face transformers and, if installed, llama.cpp,
run on the same weights, thread count and dtype as Folio.

transformers cannot open our GGUF quickly, so its model is built from Folio's own loader
output (config + dequantized, Hugging Face-named weights): both engines then multiply the
very same float32 matrices. llama.cpp runs the GGUF file itself (its quantized kernels), so
its numbers are a reference point, not a like-for-like comparison.

torch is imported where it is used, not at the top: a llama.cpp side in a process of its own
(``sizes``) drives ``LlamaCppChat`` without torch in its memory.

Every side answers a chat turn through ``reply(prompt_ids, max_tokens) -> Reply``; what a
side keeps between turns (nothing, a DynamicCache, llama.cpp's context) is its own business.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(slots=True)
class Reply:
    """One generated reply, timed from the moment the prompt was handed over."""

    token_ids: list[int]
    ttft_s: float  # prefill forward + first token
    computed_prompt_tokens: int  # prompt tokens this side actually ran through the model
    prompt_tokens: int
    token_times: list[float] = field(default_factory=list)  # perf_counter at each token
    wall_s: float = 0.0
    mean_tok_s: float = 0.0  # tokens after the first / time from the first to the last

    @property
    def median_tok_s(self) -> float:
        return median_rate(self.token_times)


def median_rate(*token_times: list[float]) -> float:
    """Tokens per second from the median gap between consecutive tokens (of one run, or of
    several runs pooled): the median keeps one stall (another process on the machine) from
    moving the figure."""
    gaps = sorted(b - a for times in token_times
                  for a, b in zip(times, times[1:], strict=False))
    if not gaps:
        return 0.0
    middle = len(gaps) // 2
    gap = gaps[middle] if len(gaps) % 2 else (gaps[middle - 1] + gaps[middle]) / 2
    return 1.0 / gap if gap > 0 else 0.0


def mean_rate(token_times: list[float]) -> float:
    span = token_times[-1] - token_times[0] if len(token_times) > 1 else 0.0
    return (len(token_times) - 1) / span if span > 0 else 0.0


# ----------------------------------------------------------------------------- transformers
class _TokenClock:
    """A generate() streamer that only notes when each new token comes out. generate hands
    it the prompt first, then one tensor per decoding step."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def transformers_config(config):
    """``config`` as transformers' own class: a later load's cached config comes back as
    a ``FileConfig`` (engine/loaders/gguf/file_config.py), which holds the same values
    but is not a class transformers' auto classes know."""
    from engine.loaders.gguf.file_config import FileConfig

    if not isinstance(config, FileConfig):
        return config
    from transformers import AutoConfig

    values = config.to_dict()
    return AutoConfig.for_model(values.pop("model_type"), **values)


def build_transformers_model(loaded) -> torch.nn.Module:
    """A transformers causal LM holding exactly the weights Folio loaded, in float32.

    ``loaded``: ``engine.loaders.base.LoadedModel``. Its weight stream is read once more, so the
    two models do not share storage (neither can disturb the other's memory layout).
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(transformers_config(loaded.config))
    model = model.to(torch.float32)
    weights = {name: tensor.to(torch.float32) for name, tensor in loaded.weights}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = getattr(loaded.config, "tie_word_embeddings", False)
    missing = [name for name in missing if not (tied and name == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"transformers model does not match the loaded weights: missing "
                         f"{missing[:3]}, unexpected {unexpected[:3]}")
    if tied:
        model.tie_weights()
    model.generation_config.pad_token_id = loaded.config.eos_token_id
    return model.eval()


def hf_generate(model, prompt_ids: list[int], max_tokens: int, cache=None,
                computed: int | None = None) -> Reply:
    """Greedy ``generate`` of exactly ``max_tokens`` tokens (end-of-sequence suppressed, as
    Folio's ignore_eos). With ``cache``, generate feeds only the tokens it does not hold."""
    import torch

    ids = torch.tensor([prompt_ids], dtype=torch.long)
    clock = _TokenClock()
    kwargs = {"cache": cache} if cache is not None else {}
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                         streamer=clock, **kwargs)
    wall = time.perf_counter() - start
    new = out[0, len(prompt_ids):].tolist()
    assert len(new) == max_tokens and len(clock.times) == max_tokens, "generate stopped early"
    return Reply(new, clock.times[0] - start,
                 len(prompt_ids) if computed is None else computed, len(prompt_ids),
                 clock.times, wall, mean_rate(clock.times))


class HFRecompute:
    """What a naive app does: every turn, ``generate`` over the whole history."""

    label = "transformers (recompute)"

    def __init__(self, model) -> None:
        self.model = model

    def reply(self, prompt_ids: list[int], max_tokens: int) -> Reply:
        return hf_generate(self.model, prompt_ids, max_tokens)


class HFCached:
    """transformers done well: one DynamicCache kept across turns; each turn feeds only the
    tokens the cache does not hold yet (the last reply token, then the new message)."""

    label = "transformers (DynamicCache)"

    def __init__(self, model) -> None:
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.history: list[int] = []

    def reply(self, prompt_ids: list[int], max_tokens: int) -> Reply:
        held = self.cache.get_seq_length()
        if prompt_ids[:held] != self.history[:held]:
            raise ValueError("the chat history changed; a DynamicCache cannot be reused")
        result = hf_generate(self.model, prompt_ids, max_tokens, self.cache,
                             computed=len(prompt_ids) - held)
        self.history = prompt_ids + result.token_ids
        return result


def hf_candidates(model, prompt_ids: list[int], n: int, max_tokens: int, seed: int) -> float:
    """Wall seconds for ``n`` sampled candidates of ``max_tokens`` via num_return_sequences
    (transformers copies the prompt n times and prefills every copy)."""
    import torch

    torch.manual_seed(seed)
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                         temperature=0.8, top_p=1.0, top_k=0, num_return_sequences=n,
                         max_new_tokens=max_tokens, min_new_tokens=max_tokens)
    wall = time.perf_counter() - start
    assert out.shape == (n, len(prompt_ids) + max_tokens), "generate stopped early"
    return wall


# ------------------------------------------------------------------------------- llama.cpp
def llama_cpp_status(model_path: Path) -> str | None:
    """None when llama.cpp can run this model here, else why not (for the report)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return "llama.cpp skipped: llama_cpp is not installed (pip install -e '.[bench]')"
    if model_path.suffix.lower() != ".gguf":
        return "llama.cpp skipped: it needs a .gguf file, the model is a folder"
    return None


class LlamaCppChat:
    """llama.cpp on the GGUF file. It keeps one context and, like Folio, re-evaluates only
    what follows the longest common prefix with what it already holds."""

    label = "llama.cpp (GGUF)"

    def __init__(self, model_path: Path, threads: int, n_ctx: int, **options) -> None:
        """``options``: more of ``Llama``'s arguments (``bench kv``: the cache's
        ``type_k`` / ``type_v`` and ``flash_attn``)."""
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(model_path), n_ctx=n_ctx, n_batch=512,
                         n_threads=threads, n_threads_batch=threads, verbose=False, **options)

    def reply(self, prompt_ids: list[int], max_tokens: int) -> Reply:
        from engine.core.sequence import common_prefix

        common = common_prefix([int(t) for t in self.llm.input_ids[: self.llm.n_tokens]],
                               prompt_ids)
        # llama.cpp always evaluates the last prompt token again, for its logits.
        computed = len(prompt_ids) - min(common, len(prompt_ids) - 1)
        tokens: list[int] = []
        times: list[float] = []
        start = time.perf_counter()
        for token in self.llm.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                       repeat_penalty=1.0, reset=True):
            times.append(time.perf_counter())
            tokens.append(int(token))
            if len(tokens) == max_tokens:
                break
        return Reply(tokens, times[0] - start, computed, len(prompt_ids), times,
                     times[-1] - start, mean_rate(times))
