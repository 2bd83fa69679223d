"""``folio bench kv``'s quality half: what a quantized KV cache changes in the output of a
model (the starter), against the float16 cache in the same run.

- **Teacher-forced mean KL**: the first ``text_tokens`` ids of a fixed text (kv_text.TEXT)
  are read in 512-token chunks into the engine's own pool, as prefill reads a prompt (each
  chunk's attention reads its own K/V back from the pool, in the format under test), and
  every position's next-token distribution is kept; the mean over positions of
  KL(float16 || format), in nats.
- **Greedy agreement**: ``prompts`` chat prompts, ~``context_words`` words of the same text
  and a question each (kv_text.QUESTIONS); greedy ``reply_tokens``-token replies (end of
  sequence ignored, so each is that long); how many are token for token the float16
  cache's, and where each other one parts from it (`Parting`): at a near-tie of float16's
  two likeliest tokens, any small change of the logits decides the reply.

Each format gets one engine (``weights`` as the bench's, compute float32 on the CPU, as
every bench side); one that cannot load reports why instead of figures. The engine tests
(tests/engine/test_kv_precision_engine.py) assert the issue's bars with these functions.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

from engine.bench.kv_text import QUESTIONS, TEXT, leading_paragraphs
from engine.bench.setup import folio_config
from engine.sampling_params import SamplingParams

REFERENCE = "float16"
CHUNK = 512  # prompt tokens read per forward, as the engine's prefill chunks them


@dataclass(slots=True, frozen=True)
class Parting:
    """Where a greedy reply first differs from float16's."""

    reply: int  # its prompt's index
    token: int  # the first differing token's index in the reply
    float16_gap: float | None  # float16's two likeliest tokens there, apart in nats


@dataclass(slots=True)
class FormatQuality:
    name: str
    mean_kl: float | None = None  # nats, against the float16 cache; None for float16
    greedy_equal: int | None = None  # replies equal to float16's
    replies: list[list[int]] = field(default_factory=list)
    partings: list[Parting] = field(default_factory=list)  # each reply not equal
    # The float16 reference's only: at each token of each reply, how far its two likeliest
    # tokens were apart (nats).
    top_two_gaps: list[list[float]] = field(default_factory=list)
    bytes_per_token: int | None = None  # as the loaded engine counts it (KV stats)
    error: str | None = None  # why it could not run


def quality(model_path: str, threads: int, weights: str, formats: tuple[str, ...],
            text_tokens: int, context_words: int, prompts: int, reply_tokens: int
            ) -> tuple[list[int], FormatQuality, dict[str, FormatQuality]]:
    """The text's ids, the float16 reference's figures (its bytes and replies) and each
    of ``formats``' against it. Raises RuntimeError when the reference cannot load."""
    if prompts > len(QUESTIONS):
        raise ValueError(f"prompts must be at most {len(QUESTIONS)}, got {prompts}")
    context = leading_paragraphs(context_words)
    messages = [[{"role": "user", "content": f"{context}\n\n{q}"}]
                for q in QUESTIONS[:prompts]]
    greedy = SamplingParams(max_tokens=reply_tokens, temperature=0, ignore_eos=True)
    ref = FormatQuality(REFERENCE)
    llm = _load(model_path, threads, weights, ref)
    if llm is None:
        raise RuntimeError(ref.error)
    text = llm.tokenizer.encode(TEXT)[:text_tokens]
    if len(text) < text_tokens:
        raise ValueError(f"text_tokens must be at most {len(text)} (the fixed text's "
                         f"length in this model's tokens), got {text_tokens}")
    reference = teacher_forced_logprobs(llm, text)
    # Log-probabilities come from the logits before sampling: asking for them leaves the
    # greedy replies as they are.
    with_gaps = SamplingParams(max_tokens=reply_tokens, temperature=0, ignore_eos=True,
                               logprobs=2)
    for reply in (llm.chat(m, with_gaps).outputs[0] for m in messages):
        ref.replies.append(list(reply.token_ids))
        ref.top_two_gaps.append([top_two_gap(step.top) for step in reply.logprobs])
    del llm
    results: dict[str, FormatQuality] = {}
    for name in formats:
        got = results[name] = FormatQuality(name)
        llm = _load(model_path, threads, weights, got)
        if llm is None:
            continue
        got.mean_kl = mean_kl(reference, teacher_forced_logprobs(llm, text))
        got.replies = [list(llm.chat(m, greedy).outputs[0].token_ids) for m in messages]
        got.greedy_equal = sum(a == b for a, b in zip(got.replies, ref.replies, strict=True))
        got.partings = partings(ref, got.replies)
        del llm
        gc.collect()
    return text, ref, results


def _load(model_path: str, threads: int, weights: str, got: FormatQuality):
    """An engine whose KV cache is ``got.name``, its bytes per token noted; None (and
    ``got.error``) when the engine refuses the format."""
    from engine.llm import LLM

    try:
        llm = LLM(model_path, folio_config(threads, weights, kv_cache_dtype=got.name))
    except (ValueError, RuntimeError) as exc:
        got.error = f"{got.name} did not load: {exc}"
        return None
    stats = llm.kv_stats(with_blocks=False)
    got.bytes_per_token = stats.bytes_per_block // stats.block_size
    return llm


def teacher_forced_logprobs(llm, ids: list[int]):
    """[len(ids), vocab] float32: log-softmax of the logits after every id of ``ids``, the
    text read in CHUNK-token chunks into the engine's pool (one sequence on blocks 0, 1,
    2, ...: the pool must hold them, and the model must have one KV group, as the starter
    has)."""
    import torch

    from kernels import AttentionMetadata

    runner = llm.engine.runner
    if len(runner.kv_caches) != 1:
        raise ValueError("teacher forcing reads a model with one KV group")
    (cache,) = runner.kv_caches
    block = runner.shape.block_size
    table = torch.arange(-(-len(ids) // block), dtype=torch.int32)[None]
    out = []
    with torch.inference_mode():
        for start in range(0, len(ids), CHUNK):
            end = min(len(ids), start + CHUNK)
            meta = AttentionMetadata(torch.tensor([0, end - start], dtype=torch.int32),
                                     torch.tensor([end], dtype=torch.int32), table,
                                     torch.arange(start, end), end - start, end)
            layers = [(cache[i, 0], cache[i, 1], meta) for i in range(cache.shape[0])]
            hidden = runner.model(torch.tensor(ids[start:end]), torch.arange(start, end),
                                  layers, meta, runner.backend)
            out.append(runner.model.compute_logits(hidden).float().log_softmax(-1))
    return torch.cat(out)


def top_two_gap(top: tuple[tuple[int, float], ...]) -> float | None:
    """How far apart a step's two likeliest tokens were (nats); None without two."""
    return top[0][1] - top[1][1] if len(top) >= 2 else None


def partings(reference: FormatQuality, replies: list[list[int]]) -> list[Parting]:
    """Where each of ``replies`` that is not the reference's parts from it."""
    found = []
    for index, (ref, reply) in enumerate(zip(reference.replies, replies, strict=True)):
        # A reply cut short parts where it ends.
        token = next((i for i, (a, b) in enumerate(zip(ref, reply, strict=False)) if a != b),
                     None if len(ref) == len(reply) else min(len(ref), len(reply)))
        if token is None:
            continue
        gaps = reference.top_two_gaps[index] if reference.top_two_gaps else []
        found.append(Parting(index, token, gaps[token] if token < len(gaps) else None))
    return found


def mean_kl(reference, logprobs) -> float:
    """Mean over positions of KL(reference || logprobs), in nats ([positions, vocab]
    log-distributions each)."""
    return float((reference.exp() * (reference - logprobs)).sum(-1).mean())
