"""Batched logits processing and sampling with per-row seeded generators.

A row constrained by a grammar (structured output) first has every token its mask
forbids set to -inf, so no processor after it can bring one back. Order of the
processors, as in transformers: repetition penalty, temperature, top-k,
top-p, min-p, then one inverse-CDF draw. Every filter is a per-row threshold applied in
token-id order (never a position in a sorted list), and every row draws exactly one
uniform number from its own generator per step, so a row's token does not depend on the
other rows of the batch nor on how ties happen to be ordered by a sort.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.sampling_params import SamplingParams

# Top-p ranks the 64 most probable tokens first, then 512, then the whole vocabulary:
# ranking everything costs a full sort, which only flat distributions need.
_TOP_P_FIRST_WINDOW = 64
_TOP_P_WIDEST_WINDOW = 512
# Dividing by a smaller temperature could overflow the logits to inf (and softmax to NaN);
# at this one the draw is already the argmax for any realistic logit gap.
_MIN_TEMPERATURE = 1e-5


@dataclass(slots=True)
class SamplingRow:
    params: SamplingParams
    generator: torch.Generator | None  # None: the global torch generator
    token_ids: Sequence[int]  # prompt + output so far, for the repetition penalty
    allowed: torch.Tensor | None = None  # bool [vocab]: the tokens a grammar allows


_SEED_SPACE = 2**64  # torch.Generator.manual_seed takes [0, 2**64) (and negatives)


def make_generator(
    seed: int | None, candidate_index: int, device: str | torch.device = "cpu"
) -> torch.Generator:
    """The generator of candidate `candidate_index` of a request.

    With a seed `s`, candidate i draws like an n=1 request with seed `s + i`; without one,
    each candidate gets its own generator seeded from the OS's randomness. `s + i` is
    taken modulo 2**64, the generator's seed range, so no seed in SamplingParams' range
    and no candidate index can overflow it.
    """
    if not isinstance(candidate_index, int) or candidate_index < 0:
        raise ValueError(f"candidate_index must be an integer >= 0, got {candidate_index!r}")
    generator = torch.Generator(device=device)
    if seed is None:
        generator.manual_seed(secrets.randbits(63))
    else:
        generator.manual_seed((seed + candidate_index) % _SEED_SPACE)
    return generator


class Sampler:
    """`sampler(logits [N, vocab] float32, rows) -> N token ids` (one per row).

    Greedy rows (temperature 0) take the argmax of the logits after the repetition penalty
    (ties: the lowest id); the other rows draw from `probabilities`.
    """

    def __call__(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> list[int]:
        greedy, greedy_tokens, sampled, probs = _process(logits, rows)
        tokens = [0] * len(rows)
        for i, token in zip(greedy, greedy_tokens, strict=True):
            tokens[i] = token
        if sampled:
            chosen = _inverse_cdf(probs, [rows[i].generator for i in sampled])
            for i, token in zip(sampled, chosen, strict=True):
                tokens[i] = token
        return tokens

    def probabilities(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """[N, vocab]: the distribution each row samples from after every processor (one-hot
        at the argmax for greedy rows). Zero means the token can never be drawn."""
        greedy, greedy_tokens, sampled, probs = _process(logits, rows)
        out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        out[greedy, greedy_tokens] = 1.0
        if sampled:
            out[sampled] = probs / probs.sum(dim=-1, keepdim=True)
        return out

    @staticmethod
    def draw(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> list[int]:
        """One token per row of ``probs`` [N, vocab] (not necessarily normalised), with
        one uniform number from each row's generator, as the sampled rows draw."""
        return _inverse_cdf(probs, generators)

    @staticmethod
    def uniform(generator: torch.Generator | None) -> float:
        """One uniform number in [0, 1) from ``generator`` (a speculative draft's test)."""
        return _uniform(generator)


def _process(
    logits: torch.Tensor, rows: Sequence[SamplingRow]
) -> tuple[list[int], list[int], list[int], torch.Tensor]:
    """(greedy rows, their tokens, sampled rows, their unnormalised probabilities)."""
    if logits.dim() != 2 or logits.shape[0] != len(rows):
        raise ValueError(
            f"logits must be [len(rows), vocab]; got {tuple(logits.shape)} for {len(rows)} rows"
        )
    logits = _masked(logits, rows)
    greedy, sampled = _split(rows)
    greedy_tokens: list[int] = []
    probs = logits.new_empty((0, logits.shape[1]), dtype=torch.float32)
    if greedy:
        subset = [rows[i] for i in greedy]
        greedy_tokens = _argmax_rows(_penalized(logits, greedy, subset))
    if sampled:
        subset = [rows[i] for i in sampled]
        probs = _filtered_probs(_penalized(logits, sampled, subset), subset)
    return greedy, greedy_tokens, sampled, probs


def _argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's first largest value's index (a NaN counts as the largest, as in
    torch.argmax). On the CPU numpy's argmax: torch's reads a vocabulary row several
    times slower, on every greedy step."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.detach().numpy().argmax(axis=-1).tolist()
    return torch.argmax(logits, dim=-1).tolist()


def _masked(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """The logits with each constrained row's forbidden tokens at -inf (a copy: the
    caller's logits, which log-probabilities read, are never written)."""
    constrained = [i for i, row in enumerate(rows) if row.allowed is not None]
    if not constrained:
        return logits
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        # numpy's single-threaded copy and fill: torch would wake its thread pool for each.
        values = logits.detach().numpy().copy()
        for i in constrained:
            np.putmask(values[i], ~rows[i].allowed.numpy(), -np.inf)
        return torch.from_numpy(values)
    allowed = torch.stack([rows[i].allowed for i in constrained]).to(logits.device)
    logits = logits.clone()
    logits[constrained] = logits[constrained].masked_fill(~allowed, float("-inf"))
    return logits


def _split(rows: Sequence[SamplingRow]) -> tuple[list[int], list[int]]:
    greedy = [i for i, row in enumerate(rows) if row.params.temperature == 0]
    sampled = [i for i, row in enumerate(rows) if row.params.temperature != 0]
    return greedy, sampled


def _penalized(
    logits: torch.Tensor, indices: list[int], rows: Sequence[SamplingRow]
) -> torch.Tensor:
    """logits[indices] in float32 after transformers' repetition penalty: each distinct seen
    token's logit is divided by the penalty when positive, multiplied when negative
    (prompt tokens count). The caller's logits are never written."""
    subset = logits if len(indices) == logits.shape[0] else logits[indices]
    subset = subset.float()
    copied = subset.data_ptr() != logits.data_ptr()
    for r, row in enumerate(rows):
        penalty = row.params.repetition_penalty
        if penalty == 1.0 or len(row.token_ids) == 0:
            continue
        if not copied:
            subset, copied = subset.clone(), True
        seen = torch.as_tensor(list(set(row.token_ids)), dtype=torch.long, device=logits.device)
        scores = subset[r, seen]
        subset[r, seen] = torch.where(scores < 0, scores * penalty, scores / penalty)
    return subset


def _filtered_probs(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p as one probability floor per row; the
    result is not renormalised (the draw scales by each row's total)."""
    params = [row.params for row in rows]
    temperature = _column([max(p.temperature, _MIN_TEMPERATURE) for p in params], logits)
    probs = torch.softmax(logits / temperature, dim=-1)
    floors = [_floor(probs[r], p) for r, p in enumerate(params)]
    if any(floors):
        # Ties with a row's floor stay, as transformers keeps ties with the k-th logit.
        probs = torch.where(probs < _column(floors, probs), 0.0, probs)
    return probs


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device).unsqueeze(1)


def _floor(probs: torch.Tensor, params: SamplingParams) -> float:
    """The lowest probability a token may have and still be drawn.

    top-k keeps the k most probable tokens; top-p then keeps the smallest set of most
    probable tokens whose mass reaches top_p of what top-k kept; min-p keeps tokens at
    least min_p times as probable as the most probable one. Renormalising after a filter
    changes no ratio, so all three read the one softmax.
    """
    vocab = probs.numel()
    top_k = params.top_k if 0 < params.top_k < vocab else 0
    if not top_k and params.top_p >= 1.0:
        return params.min_p * float(probs.max()) if params.min_p > 0.0 else 0.0
    # The kept set is usually a few dozen tokens: rank a window of the most probable ones
    # and widen it only while the nucleus does not fit (top-k's window always fits).
    window = top_k or _TOP_P_FIRST_WINDOW
    while True:
        ranked = _most_probable(probs, window)
        mass = torch.cumsum(ranked, dim=0)
        wanted = params.top_p * (float(mass[-1]) if top_k else 1.0)
        if top_k or float(mass[-1]) >= wanted or window == vocab:
            break
        window = vocab if window >= _TOP_P_WIDEST_WINDOW else _TOP_P_WIDEST_WINDOW
    # A token is kept while the mass ranked above it is short of the target (so >= 1).
    kept = int(((mass - ranked) < wanted).sum())
    return max(float(ranked[kept - 1]), params.min_p * float(ranked[0]))


def _most_probable(probs: torch.Tensor, window: int) -> torch.Tensor:
    """The `window` highest probabilities in descending order, float64 on the CPU (where
    the few small sums of the floor search cost least)."""
    if window < probs.numel():
        ranked = torch.topk(probs, window).values.cpu()
    elif probs.device.type == "cpu":
        # numpy sorts a 49k vocabulary several times faster than torch does on CPU.
        ranked = torch.from_numpy(np.sort(probs.numpy())[::-1].copy())
    else:
        ranked = torch.sort(probs, descending=True).values.cpu()
    return ranked.double()


def _inverse_cdf(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> list[int]:
    """One uniform draw per row from its own generator, mapped through the row's CDF in
    token-id order (float64 so 49k small terms add up without drift)."""
    uniform = torch.tensor([_uniform(g) for g in generators], dtype=torch.float64)
    cdf = torch.cumsum(probs.double(), dim=-1)
    target = (uniform.to(cdf.device) * cdf[:, -1]).unsqueeze(1)
    # The first token whose cumulative mass exceeds the target: never a zero-prob token.
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(1).tolist()
    vocab = probs.shape[1]
    for r, token in enumerate(tokens):
        if token >= vocab:  # target rounded up to the total: take the last possible token
            tokens[r] = int(torch.nonzero(probs[r]).max())
    return tokens


def _uniform(generator: torch.Generator | None) -> float:
    device = generator.device if generator is not None else "cpu"
    return float(torch.rand(1, generator=generator, dtype=torch.float64, device=device))
