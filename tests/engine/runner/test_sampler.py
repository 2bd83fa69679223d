"""Sampler: each logits processor on hand-made logits, transformers as an oracle, seeded
draws that do not depend on the rest of the batch, and per-candidate generators."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from engine.runner.sampler import Sampler, SamplingRow, make_generator
from engine.sampling_params import SamplingParams

sampler = Sampler()


def row(seed: int | None = 0, token_ids: list[int] | None = None, **params) -> SamplingRow:
    generator = make_generator(seed, 0) if seed is not None else None
    return SamplingRow(SamplingParams(**params), generator, token_ids or [])


def log_probs(*probs: float) -> list[float]:
    return [math.log(p) for p in probs]


def expected(values: list[float]) -> torch.Tensor:
    """softmax over the finite entries, zero where the entry is None (filtered out)."""
    finite = torch.tensor([v if v is not None else -math.inf for v in values])
    return torch.softmax(finite, dim=-1)


def test_greedy_is_argmax_with_ties_to_the_lowest_id() -> None:
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0], [3.0, 1.0, 0.0, 3.5]])
    rows = [row(temperature=0.0), row(temperature=0.0)]
    before = rows[0].generator.get_state()
    assert sampler(logits, rows) == [1, 3]
    # Greedy rows draw nothing, so a seeded stream is not shifted by greedy steps.
    assert torch.equal(rows[0].generator.get_state(), before)


def test_greedy_equals_torch_argmax_on_a_full_vocabulary() -> None:
    logits = torch.randn(8, 49152, generator=torch.Generator().manual_seed(3))
    rows = [row(temperature=0.0) for _ in range(8)]
    assert sampler(logits, rows) == torch.argmax(logits, dim=-1).tolist()
    probs = sampler.probabilities(logits, rows)
    assert probs.sum().item() == 8.0
    assert torch.argmax(probs, dim=-1).tolist() == torch.argmax(logits, dim=-1).tolist()


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, -0.5]])
    original = logits.clone()
    penalized = row(token_ids=[0, 1, 1, 4], repetition_penalty=2.0)
    probs = sampler.probabilities(logits, [penalized])
    torch.testing.assert_close(probs[0], expected([1.0, -4.0, 1.0, 0.5, -1.0]))
    assert torch.equal(logits, original)  # the caller's logits are left alone


def test_repetition_penalty_applies_to_greedy_rows() -> None:
    logits = torch.tensor([[2.0, 1.5, 0.0]])
    assert sampler(logits, [row(temperature=0.0, token_ids=[0])]) == [0]
    assert sampler(logits, [row(temperature=0.0, token_ids=[0], repetition_penalty=2.0)]) == [1]
    # Below 1 the penalty is a bonus.
    logits = torch.tensor([[1.0, 1.5]])
    assert sampler(logits, [row(temperature=0.0, token_ids=[0], repetition_penalty=0.5)]) == [0]


def test_temperature_divides_the_logits() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    probs = sampler.probabilities(logits, [row(temperature=0.5)])
    torch.testing.assert_close(probs[0], expected([0.0, 2.0, 4.0]))


def test_a_tiny_temperature_draws_the_argmax_without_overflow() -> None:
    logits = torch.tensor([[1.0, 2.0, 1.5]])
    tiny = row(temperature=1e-45)
    assert sampler.probabilities(logits, [tiny]).tolist() == [[0.0, 1.0, 0.0]]
    assert sampler(logits, [tiny]) == [1]


def test_top_k_keeps_the_k_highest_logits_per_row() -> None:
    values = [0.1, 3.0, 2.0, -1.0, 2.5]
    logits = torch.tensor([values] * 4)
    rows = [row(top_k=2), row(top_k=1), row(top_k=0), row(top_k=5)]
    probs = sampler.probabilities(logits, rows)
    torch.testing.assert_close(probs[0], expected([None, 3.0, None, None, 2.5]))
    assert probs[1].tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(probs[2], expected(values))  # 0 turns it off
    torch.testing.assert_close(probs[3], expected(values))  # k >= vocab keeps everything


def test_top_k_keeps_ties_with_the_kth_logit_as_transformers_does() -> None:
    probs = sampler.probabilities(torch.tensor([[3.0, 2.0, 2.0, 1.0]]), [row(top_k=2)])
    torch.testing.assert_close(probs[0], expected([3.0, 2.0, 2.0, None]))


def test_half_precision_logits_are_read_as_float32() -> None:
    logits = torch.tensor([[0.5, 2.0, 1.0]], dtype=torch.bfloat16)
    probs = sampler.probabilities(logits, [row(top_k=2)])
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs[0], expected([None, 2.0, 1.0]))
    assert sampler(logits, [row(temperature=0.0)]) == [1]


def test_top_p_keeps_the_smallest_nucleus_reaching_p() -> None:
    logits = torch.tensor([log_probs(0.05, 0.5, 0.15, 0.3)] * 3)
    rows = [row(top_p=0.7), row(top_p=0.45), row(top_p=0.9)]
    probs = sampler.probabilities(logits, rows)
    torch.testing.assert_close(probs[0], torch.tensor([0.0, 0.625, 0.0, 0.375]))
    assert probs[1].tolist() == [0.0, 1.0, 0.0, 0.0]
    torch.testing.assert_close(probs[2], torch.tensor([0.0, 0.5, 0.15, 0.3]) / 0.95)


def _sorted_top_p_reference(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    probs = torch.softmax(logits.double(), dim=-1)
    ranked, order = torch.sort(probs, descending=True)
    keep_ranked = (torch.cumsum(ranked, dim=-1) - ranked) < top_p
    keep = torch.zeros_like(keep_ranked)
    keep[order[keep_ranked]] = True
    kept = torch.where(keep, probs, 0.0)
    return (kept / kept.sum()).float()


def test_top_p_widens_its_window_for_flat_distributions() -> None:
    logits = torch.randn(3, 5000, generator=torch.Generator().manual_seed(11))
    top_ps = [0.5, 0.9, 0.99]
    probs = sampler.probabilities(logits, [row(top_p=p) for p in top_ps])
    sizes = [int((probs[r] > 0).sum()) for r in range(3)]
    for r, top_p in enumerate(top_ps):
        reference = _sorted_top_p_reference(logits[r], top_p)
        assert sizes[r] == int((reference > 0).sum())
        torch.testing.assert_close(probs[r], reference)
    assert sizes[0] > 64 and sizes[2] > 512  # past the first window and the second


def test_min_p_drops_tokens_below_a_share_of_the_top_probability() -> None:
    logits = torch.tensor([log_probs(0.5, 0.3, 0.15, 0.05)] * 2)
    probs = sampler.probabilities(logits, [row(min_p=0.2), row(min_p=0.7)])
    torch.testing.assert_close(probs[0], torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)
    assert probs[1].tolist() == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05),
        dict(temperature=1.3, top_k=0, top_p=0.8, min_p=0.0),
        dict(temperature=1.0, top_k=20, top_p=1.0, min_p=0.1),
    ],
)
def test_processors_match_transformers(settings: dict) -> None:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 1000, generator=gen) * 2
    history = torch.randint(0, 1000, (4, 30), generator=gen)
    rows = [
        row(token_ids=history[r].tolist(), repetition_penalty=1.2, **settings) for r in range(4)
    ]
    ours = sampler.probabilities(logits, rows)
    oracle = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2)])
    oracle.append(TemperatureLogitsWarper(settings["temperature"]))
    if settings["top_k"]:
        oracle.append(TopKLogitsWarper(settings["top_k"]))
    if settings["top_p"] < 1:
        oracle.append(TopPLogitsWarper(settings["top_p"]))
    if settings["min_p"]:
        oracle.append(MinPLogitsWarper(settings["min_p"]))
    theirs = torch.softmax(oracle(history, logits.clone()), dim=-1)
    assert torch.equal(ours > 0, theirs > 0)
    torch.testing.assert_close(ours, theirs)


def test_draws_follow_the_distribution() -> None:
    logits = torch.tensor([log_probs(0.5, 0.3, 0.2)])
    sharp = torch.tensor([[0.0, 1.0, 2.0]])
    plain, cooled = row(seed=0), row(seed=1, temperature=0.5)
    counts = torch.zeros(2, 3)
    draws = 4000
    for _ in range(draws):
        counts[0, sampler(logits, [plain])[0]] += 1
        counts[1, sampler(sharp, [cooled])[0]] += 1
    torch.testing.assert_close(counts[0] / draws, torch.tensor([0.5, 0.3, 0.2]),
                               atol=0.03, rtol=0)
    torch.testing.assert_close(counts[1] / draws, expected([0.0, 2.0, 4.0]), atol=0.03, rtol=0)


def test_a_fixed_seed_gives_fixed_ids() -> None:
    logits = torch.zeros(1, 10)
    seeded = row(seed=1234)
    # Flat over 10 tokens, each step's token is floor(10 u) for the seed's next float64 u.
    uniforms = torch.Generator().manual_seed(1234)
    floors = [int(torch.rand(1, generator=uniforms, dtype=torch.float64) * 10) for _ in range(12)]
    draws = [sampler(logits, [seeded])[0] for _ in range(12)]
    assert draws == floors == [2, 0, 4, 4, 3, 2, 1, 2, 2, 9, 8, 0]


def test_draws_never_pick_a_filtered_token() -> None:
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(2))
    allowed = set(torch.topk(logits[0], 3).indices.tolist())
    narrow = row(seed=9, top_k=3, temperature=5.0)
    assert {sampler(logits, [narrow])[0] for _ in range(500)} == allowed


def test_a_row_draws_the_same_alone_or_in_a_batch() -> None:
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=40, min_p=0.02,
                            repetition_penalty=1.1, seed=42)
    history = [5, 6, 7]
    alone_row = SamplingRow(params, make_generator(42, 0), history)
    batch_row = SamplingRow(params, make_generator(42, 0), history)
    others = [
        row(temperature=0.0),
        row(seed=3, top_k=5, repetition_penalty=1.3, token_ids=[1, 2]),
        row(seed=None, top_p=0.3),
    ]
    gen = torch.Generator().manual_seed(77)
    for _ in range(30):
        logits = torch.randn(1, 2000, generator=gen) * 3
        noise = torch.randn(3, 2000, generator=gen) * 3
        alone = sampler(logits, [alone_row])[0]
        batch = torch.cat([noise[:1], logits, noise[1:]])
        in_batch = sampler(batch, [others[0], batch_row, *others[1:]])[1]
        assert alone == in_batch


def test_candidate_i_draws_like_seed_plus_i() -> None:
    logits = torch.zeros(1, 1000)
    params = SamplingParams(n=4, seed=7)

    def draws(generator: torch.Generator) -> list[int]:
        candidate = SamplingRow(params, generator, [])
        return [sampler(logits, [candidate])[0] for _ in range(20)]

    assert draws(make_generator(7, 1)) == draws(make_generator(8, 0))
    assert draws(make_generator(7, 0)) != draws(make_generator(7, 1))


def test_candidates_in_one_batch_are_distinct_draws() -> None:
    params = SamplingParams(n=4, seed=7)
    rows = [SamplingRow(params, make_generator(7, i), []) for i in range(4)]
    logits = torch.zeros(4, 1000)
    columns = list(zip(*(sampler(logits, rows) for _ in range(10)), strict=True))
    assert len(set(columns)) == 4


def test_seed_none_still_draws_per_row() -> None:
    first, second = make_generator(None, 0), make_generator(None, 0)
    logits = torch.zeros(1, 1000)
    a = [sampler(logits, [SamplingRow(SamplingParams(), first, [])])[0] for _ in range(30)]
    b = [sampler(logits, [SamplingRow(SamplingParams(), second, [])])[0] for _ in range(30)]
    assert a != b
    assert all(0 <= t < 1000 for t in a + b)
    # A row without a generator uses torch's global one.
    assert 0 <= sampler(logits, [SamplingRow(SamplingParams(), None, [])])[0] < 1000


def test_bad_inputs_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="logits must be"):
        sampler(torch.zeros(2, 5), [row()])
    with pytest.raises(ValueError, match="candidate_index"):
        make_generator(1, -1)


def test_a_mask_forbids_tokens_in_its_row_only_and_leaves_the_logits_unwritten() -> None:
    logits = torch.tensor([[5.0, 1.0, 0.0, 2.0], [5.0, 1.0, 0.0, 2.0]])
    before = logits.clone()
    allowed = torch.tensor([False, True, False, True])
    masked = SamplingRow(SamplingParams(temperature=0), None, [], allowed)
    free = SamplingRow(SamplingParams(temperature=0), None, [])
    assert sampler(logits, [masked, free]) == [3, 0]
    assert sampler(logits.double(), [masked, free]) == [3, 0]  # the torch path (not numpy's)
    sampled = SamplingRow(SamplingParams(temperature=1.0), make_generator(3, 0), [], allowed)
    probs = sampler.probabilities(logits, [sampled, free])
    assert torch.equal(logits, before)
    assert probs[0, 0] == 0 and probs[0, 2] == 0
    assert probs[0, 1:].tolist() == pytest.approx(
        torch.softmax(torch.tensor([1.0, -math.inf, 2.0]), -1).tolist())
    assert probs[1].tolist() == [1.0, 0.0, 0.0, 0.0]
    draws = {sampler(logits[:1], [SamplingRow(SamplingParams(temperature=2.0), make_generator(
        s, 0), [], allowed)])[0] for s in range(40)}
    assert draws == {1, 3}
