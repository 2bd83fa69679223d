"""``folio bench kv``'s quality half: what a quantized KV cache changes in the output of a
model (the starter), against the float16 cache in the same run.

- **Teacher-forced mean KL**: one fixed text (``text_tokens`` ids) is fed through the decode
  path one token at a time, whatever the model would have picked (a sampler that records
  the step's logits and returns the text's next id), so every position's distribution is
  computed reading the cache in the format under test. The mean over positions of
  KL(float16 || format), in nats. The text is the starter's own continuation of a fixed
  user message, sampled once per run from the float16 engine (temperature 0.8, seed 0):
  ordinary prose at the model's own entropy, no repeated passage the model could copy.
- **Greedy agreement**: ``prompts`` chat prompts of ~``context_words`` words of context (the
  bench's fixed user texts) and a question each; greedy ``reply_tokens``-token replies
  (end of sequence ignored, so each is that long); how many are token for token the float16
  cache's.

Each format gets one engine (``weights`` as the bench's, compute float32 on the CPU, as
every bench side); one that cannot load reports why instead of figures.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

from engine.bench.setup import USER_TEXTS, folio_config
from engine.sampling_params import SamplingParams

REFERENCE = "float16"
QUESTIONS = (
    "Summarize the trip plan above in three sentences.",
    "Which day should we spend in Sintra, and how do we get there?",
    "List every dish and restaurant idea mentioned above.",
    "What should my friend who uses a wheelchair know from the text above?",
    "Write a short message to my friends about the fado evening.",
    "What can we do on the last morning before the flight?",
)
TEXT_SEED_MESSAGE = USER_TEXTS[0]


@dataclass(slots=True)
class FormatQuality:
    name: str
    mean_kl: float | None = None  # nats, against the float16 cache; None for float16
    greedy_equal: int | None = None  # replies equal to float16's
    replies: list[list[int]] = field(default_factory=list)
    bytes_per_token: int | None = None  # as the loaded engine counts it (KV stats)
    error: str | None = None  # why it could not run


class _Forced:
    """A sampler that returns the text's next id at every step and hands the step's
    logits [1, vocab] to ``seen(step, row)`` first."""

    def __init__(self, tokens: list[int], seen) -> None:
        self.tokens, self.seen, self.step = tokens, seen, 0

    def __call__(self, logits, rows) -> list[int]:
        if len(rows) != 1:
            raise ValueError(f"teacher forcing runs one sequence, got {len(rows)}")
        self.seen(self.step, logits[0])
        token = self.tokens[self.step]
        self.step += 1
        return [token]


def context_text(words: int) -> str:
    """~``words`` words of the bench's fixed user texts, in order, cycled."""
    pool: list[str] = []
    turn = 0
    while len(pool) < words:
        pool += USER_TEXTS[turn % len(USER_TEXTS)].split()
        turn += 1
    return " ".join(pool[:words])


def quality(model_path: str, threads: int, weights: str, formats: tuple[str, ...],
            text_tokens: int, context_words: int, prompts: int, reply_tokens: int
            ) -> tuple[list[int], FormatQuality, dict[str, FormatQuality]]:
    """The text's ids, the float16 reference's figures (its bytes and replies) and each
    of ``formats``' against it. Raises RuntimeError when the reference cannot load."""
    if prompts > len(QUESTIONS):
        raise ValueError(f"prompts must be at most {len(QUESTIONS)}, got {prompts}")
    messages = [[{"role": "user", "content": f"{context_text(context_words)}\n\n{q}"}]
                for q in QUESTIONS[:prompts]]
    greedy = SamplingParams(max_tokens=reply_tokens, temperature=0, ignore_eos=True)
    ref = FormatQuality(REFERENCE)
    llm = _load(model_path, threads, weights, ref)
    if llm is None:
        raise RuntimeError(ref.error)
    text = _sample_text(llm, text_tokens)
    reference = _log_probs(llm, text)
    ref.replies = [list(llm.chat(m, greedy).outputs[0].token_ids) for m in messages]
    del llm
    results: dict[str, FormatQuality] = {}
    for name in formats:
        got = results[name] = FormatQuality(name)
        llm = _load(model_path, threads, weights, got)
        if llm is None:
            continue
        got.mean_kl = _mean_kl(llm, text, reference)
        got.replies = [list(llm.chat(m, greedy).outputs[0].token_ids) for m in messages]
        got.greedy_equal = sum(a == b for a, b in zip(got.replies, ref.replies, strict=True))
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


def _sample_text(llm, tokens: int) -> list[int]:
    prompt = llm.tokenizer.encode(TEXT_SEED_MESSAGE, add_special_tokens=False)
    params = SamplingParams(max_tokens=max(1, tokens - len(prompt)), temperature=0.8,
                            seed=0, ignore_eos=True)
    out = llm.generate([prompt], params)[0]
    return (prompt + list(out.outputs[0].token_ids))[:tokens]


def _log_probs(llm, text: list[int]):
    """[len(text) - 1, vocab] float32: each position's log-distribution, teacher-forced
    (filled in place: at 2,048 tokens of a 49,152-token vocabulary it is 400 MB)."""
    import torch

    out: list = []

    def keep(i: int, row) -> None:
        if not out:
            out.append(torch.empty(len(text) - 1, row.shape[-1], dtype=torch.float32))
        torch.log_softmax(row.float(), dim=-1, out=out[0][i])

    _force(llm, text, keep)
    return out[0]


def _mean_kl(llm, text: list[int], reference) -> float:
    """Mean over positions of KL(reference || ``llm``'s distribution), in nats."""
    import torch

    total = torch.zeros((), dtype=torch.float64)

    def add(i: int, row) -> None:
        logq = torch.log_softmax(row.float(), dim=-1)
        total.add_((reference[i].exp() * (reference[i] - logq)).sum())

    _force(llm, text, add)
    return float(total) / reference.shape[0]


def _force(llm, text: list[int], seen) -> None:
    """Feed ``text`` through the decode path: its first id as the prompt, then every next
    id whatever the logits say; ``seen(i, logits)`` hears the logits predicting
    ``text[i + 1]``."""
    engine = llm.engine
    kept = engine.sampler
    engine.sampler = _Forced(text[1:], seen)
    try:
        llm.generate([text[:1]], SamplingParams(max_tokens=len(text) - 1, temperature=0,
                                                ignore_eos=True))
    finally:
        engine.sampler = kept
