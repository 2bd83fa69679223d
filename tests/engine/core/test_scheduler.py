"""Scheduler: continuous batching over the paged KV cache, driven by a fake step loop.

``FakeRunner`` plays the model runner on a pretend KV cache (each slot holds the token
whose K/V it would hold): it applies each step's swaps and copies in the order the real
runner must (swap out, swap in, copy-on-write, forward), writes the scheduled tokens and
checks that every scheduled sequence reads its whole context back. The fake "model"
samples a token that depends only on the candidate's index and its tokens, so any
schedule must produce the same outputs as an unconstrained one.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.core.block_pool import BlockPool
from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.scheduler import RequestTooLargeError, Scheduler, SchedulerOutput
from engine.core.sequence import Request, Sequence, SequenceStatus
from engine.sampling_params import SamplingParams
from tests.engine.core.admission import allocate

REPO = Path(__file__).resolve().parents[3]
VOCAB = 1000


def only(moves: list[list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """The one KV group's pairs of a step's moves."""
    assert len(moves) <= 1
    return moves[0] if moves else []


def pool_of(sched: Scheduler) -> BlockPool:
    return sched.kv.pools[0]


def fake_token(seq: Sequence) -> int:
    return hash((seq.index, *seq.token_ids)) % VOCAB


class FakeRunner:
    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        bs = kv.block_size
        self.device: list[list[int | None]] = [[None] * bs for _ in range(kv.num_blocks)]
        self.host: list[list[int | None]] = [[None] * bs for _ in range(kv.num_host_blocks)]
        self.prompt_tokens_computed: dict[str, int] = {}  # request id -> prompt positions

    def execute(self, out: SchedulerOutput) -> None:
        kv, bs = self.kv, self.kv.block_size
        pool = kv.pools[0]
        for dev, host in only(out.swap_out):
            self.host[host] = list(self.device[dev])
        for host, dev in only(out.swap_in):
            self.device[dev] = list(self.host[host])
        for src, dst in only(out.cow_pairs):
            self.device[dst] = list(self.device[src])
        for item in out.scheduled:
            seq = item.seq
            assert seq.status is SequenceStatus.RUNNING
            table = item.block_tables[0]  # the KV cache's own list, read as the runner does
            assert table is kv.block_tables(seq)[0]
            assert len(table) == kv.blocks_needed(seq.num_tokens)
            start = seq.num_computed_tokens
            for pos in range(start, start + item.num_new_tokens):
                block = pool.blocks[table[pos // bs]]
                assert block.ref_count == 1, f"{seq.label} writes shared block {block.block_id}"
                assert block.block_hash is None, f"{seq.label} writes cached {block.block_id}"
                self.device[block.block_id][pos % bs] = seq.token_ids[pos]
                if pos < seq.num_prompt_tokens:
                    self.prompt_tokens_computed[seq.request_id] = (
                        self.prompt_tokens_computed.get(seq.request_id, 0) + 1)
        for item in out.scheduled:  # attention reads the whole context through the table
            seq = item.seq
            for pos in range(seq.num_computed_tokens + item.num_new_tokens):
                slot = self.device[item.block_tables[0][pos // bs]][pos % bs]
                assert slot == seq.token_ids[pos], f"{seq.label} reads a wrong token at {pos}"


@dataclass
class Run:
    outputs: dict[str, list[list[int]]] = field(default_factory=dict)
    reasons: dict[str, list[str | None]] = field(default_factory=dict)
    steps: list[SchedulerOutput] = field(default_factory=list)
    prompt_tokens_computed: dict[str, int] = field(default_factory=dict)


def step(sched: Scheduler, runner: FakeRunner | None = None,
         mark_first: bool = False) -> tuple[SchedulerOutput, list[Request]]:
    """One step of the engine's loop, with a fake model. ``mark_first`` runs mark_computed
    before sampling (so before fork and finish) instead of after: both orders must work."""
    out = sched.schedule()
    assert out.num_batched_tokens <= sched.max_num_batched_tokens
    assert len(out.scheduled) <= sched.max_num_seqs
    assert all(item.num_new_tokens >= 1 for item in out.scheduled)
    if runner is not None:
        runner.execute(out)
    if mark_first:
        sched.mark_computed(out)
    for item in out.scheduled:
        if not item.samples:
            continue
        group = sched.requests[item.seq.request_id]
        seqs = sched.fork(group) if item.seq.needs_fork else [item.seq]
        for seq in seqs:
            seq.append_token(fake_token(seq))
            if seq.num_output_tokens == group.params.max_tokens:
                sched.finish_seq(seq, "length")
    if not mark_first:
        sched.mark_computed(out)
    return out, sched.remove_finished() + out.finished


def drive(sched: Scheduler, mark_first: bool = False, max_steps: int = 3000,
          after_step: Callable[[Scheduler, SchedulerOutput], None] | None = None,
          runner: FakeRunner | None = None) -> Run:
    """Steps until every request is done, checking the KV content through FakeRunner."""
    run = Run()
    runner = runner or FakeRunner(sched.kv)
    while sched.has_work:
        assert len(run.steps) < max_steps, "no progress"
        out, done = step(sched, runner, mark_first)
        run.steps.append(out)
        for group in done:
            run.outputs[group.request_id] = [s.output_token_ids for s in group.seqs]
            run.reasons[group.request_id] = [s.finish_reason for s in group.seqs]
        if after_step is not None:
            after_step(sched, out)
    run.prompt_tokens_computed = runner.prompt_tokens_computed
    return run


def workload(count: int = 16, seed: int = 3) -> list[tuple[str, list[int], int]]:
    rng = random.Random(seed)
    system = [rng.randrange(VOCAB) for _ in range(12)]
    requests = []
    for i in range(count):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(5, 40))]
        if i % 2:
            prompt = system + prompt  # half share a system prompt: prefix cache hits
        requests.append((f"req{i}", prompt, rng.randint(4, 20)))
    return requests


def make_scheduler(num_blocks: int, block_size: int = 4, num_host_blocks: int = 0,
                   **kwargs) -> Scheduler:
    kv = KVCacheManager.build([KVGroupSpec((0,))], [num_blocks], block_size,
                              num_host_blocks=num_host_blocks)
    return Scheduler(kv, **kwargs)


def submit(sched: Scheduler, requests, n: int = 1) -> None:
    for request_id, prompt, max_tokens in requests:
        sched.add_request(request_id, prompt, SamplingParams(n=n, max_tokens=max_tokens))


def assert_pool_all_free(sched: Scheduler) -> None:
    pool = pool_of(sched)
    assert pool.num_free_blocks == pool.num_blocks
    assert all(b.ref_count == 0 for b in pool.blocks)
    assert pool.host_refs == {} and sched.kv.managers[0].host_tables == {}
    assert sched.kv.managers[0].tables == {}  # every table dropped with its blocks
    assert sorted(pool.host_free) == list(range(pool.num_host_blocks))
    assert sched.requests == {} and not sched.has_work


# --------------------------------------------------------------- many requests
SEEDS = [3, 5, 8]


@pytest.fixture(scope="module", params=SEEDS)
def seeded(request: pytest.FixtureRequest) -> tuple[int, Run]:
    """A workload's seed and its outputs from a pool that holds everything at once."""
    sched = make_scheduler(num_blocks=400, max_num_seqs=64, max_num_batched_tokens=2048)
    submit(sched, workload(seed=request.param))
    run = drive(sched)
    assert sched.num_preemptions == 0
    assert_pool_all_free(sched)
    return request.param, run


def test_unconstrained_run_generates_max_tokens_each(seeded: tuple[int, Run]) -> None:
    seed, unconstrained = seeded
    requests = workload(seed=seed)
    assert len(unconstrained.outputs) == 16
    for request_id, _, max_tokens in requests:
        (tokens,) = unconstrained.outputs[request_id]
        assert len(tokens) == max_tokens
        assert unconstrained.reasons[request_id] == ["length"]


@pytest.mark.parametrize("mark_first", [False, True])
def test_small_pool_completes_everything_by_recompute(seeded: tuple[int, Run],
                                                      mark_first: bool) -> None:
    seed, unconstrained = seeded
    sched = make_scheduler(num_blocks=24, max_num_seqs=8, max_num_batched_tokens=64)
    submit(sched, workload(seed=seed))
    run = drive(sched, mark_first=mark_first)
    assert sched.num_preemptions > 0
    assert any(out.preempted for out in run.steps)
    assert not any(only(out.swap_out) or only(out.swap_in) for out in run.steps)
    assert run.outputs == unconstrained.outputs
    assert all(reasons == ["length"] for reasons in run.reasons.values())
    assert_pool_all_free(sched)


@pytest.mark.parametrize("mark_first", [False, True])
def test_small_pool_completes_everything_by_swap(seeded: tuple[int, Run],
                                                 mark_first: bool) -> None:
    seed, unconstrained = seeded
    sched = make_scheduler(num_blocks=24, num_host_blocks=32, max_num_seqs=8,
                           max_num_batched_tokens=64)
    submit(sched, workload(seed=seed))
    run = drive(sched, mark_first=mark_first)
    assert sched.num_preemptions > 0
    assert any(only(out.swap_out) for out in run.steps)
    assert any(only(out.swap_in) for out in run.steps)
    assert run.outputs == unconstrained.outputs
    assert_pool_all_free(sched)


def test_prefix_cache_serves_the_shared_system_prompt() -> None:
    sched = make_scheduler(num_blocks=400, max_num_seqs=64, max_num_batched_tokens=2048)
    submit(sched, workload()[:3])
    drive(sched)
    # req1 is done, but its blocks keep the 12-token system prompt (3 full blocks):
    # a new prompt that starts with it finds them.
    prompt = workload()[1][1][:12] + [1, 2, 3]
    sched.add_request("again", prompt, SamplingParams(max_tokens=1))
    out = sched.schedule()
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("again", 3)]
    assert sched.requests["again"].num_cached_tokens == 12


# ---------------------------------------------------------------- n candidates
def test_n4_prefills_once_then_candidates_share_the_prompt_blocks() -> None:
    sched = make_scheduler(num_blocks=32, max_num_batched_tokens=64)
    prompt = list(range(10))  # blocks 0 1 full, block 2 holds 2 tokens
    sched.add_request("n4", prompt, SamplingParams(n=4, max_tokens=6))
    seen: list[SchedulerOutput] = []

    def check(sched: Scheduler, out: SchedulerOutput) -> None:
        seen.append(out)
        group = sched.requests.get("n4")
        if len(seen) == 1:
            assert [s.num_new_tokens for s in out.scheduled] == [10]
            assert [s.num_computed_tokens for s in group.seqs] == [10, 10, 10, 10]
            assert [sched.kv.block_tables(s)[0] for s in group.seqs] == [[0, 1, 2]] * 4
            assert [pool_of(sched).blocks[b].ref_count for b in (0, 1, 2)] == [4, 4, 4]
        elif len(seen) == 2:
            # Each candidate's first token lands in the shared partial block: three
            # copies, and the last candidate keeps the original.
            assert out.cow_pairs == [[(2, 3), (2, 4), (2, 5)]]
            assert [sched.kv.block_tables(s)[0] for s in group.seqs] == [
                [0, 1, 3], [0, 1, 4], [0, 1, 5], [0, 1, 2]]
            assert [pool_of(sched).blocks[b].ref_count for b in range(6)] == [4, 4, 1, 1, 1, 1]
            assert [s.num_new_tokens for s in out.scheduled] == [1, 1, 1, 1]

    run = drive(sched, after_step=check)
    assert len(seen) == 6  # the prefill samples the first token, 5 decodes the rest
    assert run.prompt_tokens_computed == {"n4": 10}
    outputs = run.outputs["n4"]
    assert [len(tokens) for tokens in outputs] == [6, 6, 6, 6]
    assert len({tuple(tokens) for tokens in outputs}) == 4
    assert_pool_all_free(sched)


@pytest.mark.parametrize("mark_first", [False, True])
def test_n4_under_preemption_matches_an_unconstrained_run(mark_first: bool) -> None:
    requests = workload(count=6, seed=11)
    big = make_scheduler(num_blocks=400, max_num_batched_tokens=1024)
    submit(big, requests, n=4)
    expected = drive(big).outputs
    # Recompute and swap; a batch narrower than a request's candidates, too.
    for host, max_num_seqs in [(0, 64), (48, 64), (0, 3), (48, 3)]:
        sched = make_scheduler(num_blocks=30, num_host_blocks=host, max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=48)
        submit(sched, requests, n=4)
        run = drive(sched, mark_first=mark_first)
        assert sched.num_preemptions > 0
        assert any(only(out.swap_out) for out in run.steps) == (host > 0)
        assert run.outputs == expected
        assert_pool_all_free(sched)


def hog(sched: Scheduler, num_blocks: int, seq_id: int) -> Sequence:
    """A sequence the test places straight in the pool: pressure from outside."""
    tokens = list(range(5000 + 100 * seq_id, 5000 + 100 * seq_id + 4 * num_blocks))
    seq = Sequence(seq_id, f"hog{seq_id}", 0, tokens, len(tokens))
    assert allocate(sched.kv, seq) == 0
    return seq


def test_recomputed_candidates_come_back_leader_first() -> None:
    requests = [("a", list(range(100, 108)), 20)]
    n3_params = SamplingParams(n=3, max_tokens=8)
    big = make_scheduler(num_blocks=64)
    submit(big, requests)
    big.add_request("n3", list(range(10)), n3_params)
    expected = drive(big).outputs

    sched = make_scheduler(num_blocks=16, max_num_batched_tokens=64)
    submit(sched, requests)
    sched.add_request("n3", list(range(10)), n3_params)
    runner = FakeRunner(sched.kv)
    step(sched, runner)  # both prefilled; n3 forked: 3 candidates share blocks 2 3 4
    squeeze = hog(sched, 9, 900)
    out, _ = step(sched, runner)  # a takes a block; the candidates' copies do not fit
    assert out.preempted == ["n3"]
    assert [s.status for s in sched.requests["n3"].seqs] == [SequenceStatus.WAITING] * 3
    sched.kv.free(squeeze)
    sched.kv.free(hog(sched, pool_of(sched).num_free_blocks, 901))  # evicts n3's cached prompt
    sched.add_request("late", [7, 7, 7], SamplingParams(max_tokens=2))

    out, _ = step(sched, runner)
    # Only the leader, although the others would fit: it recomputes the prompt once.
    assert [(s.seq.label, s.num_new_tokens) for s in out.scheduled] == [("a:0", 1),
                                                                         ("n3:0", 11)]
    n3 = sched.requests["n3"]
    assert [s.status for s in n3.seqs] == [SequenceStatus.RUNNING] + [SequenceStatus.PARKED] * 2
    assert [g.request_id for g in sched.waiting] == ["late"]  # parked candidates go first
    assert pool_of(sched).num_free_blocks == 10

    out, _ = step(sched, runner)
    # The others find the prompt's full blocks and recompute only their own tokens.
    assert [(s.seq.label, s.num_new_tokens) for s in out.scheduled] == [
        ("a:0", 1), ("n3:0", 1), ("n3:1", 3), ("n3:2", 3), ("late:0", 3)]
    leader_blocks = sched.kv.block_tables(n3.seqs[0])[0][:2]
    assert [sched.kv.block_tables(s)[0][:2] for s in n3.seqs] == [leader_blocks] * 3
    assert [pool_of(sched).blocks[b].ref_count for b in leader_blocks] == [3, 3]

    outputs = drive(sched, runner=runner).outputs
    assert {k: outputs[k] for k in ("a", "n3")} == expected
    assert [len(t) for t in outputs["late"]] == [2]
    assert_pool_all_free(sched)


# ------------------------------------------------------------- chunked prefill
def test_long_prompt_is_chunked_and_decodes_go_first() -> None:
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=16)
    submit(sched, [("a", [1, 2, 3], 50), ("b", [4, 5, 6, 7], 50)])
    drive_steps(sched, 1)
    sched.add_request("long", list(range(100, 150)), SamplingParams(max_tokens=3))
    chunks = []
    for _ in range(4):
        out = drive_steps(sched, 1)
        names = [(s.seq.request_id, s.num_new_tokens, s.samples) for s in out.scheduled]
        assert names[:2] == [("a", 1, True), ("b", 1, True)]
        assert names[2][0] == "long"
        chunks.append(names[2][1:])
    assert chunks == [(14, False), (14, False), (14, False), (8, True)]
    assert sched.requests["long"].seqs[0].num_output_tokens == 1


def test_decodes_go_before_a_prefill_whatever_the_running_order() -> None:
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=16)
    submit(sched, [("a", [1, 2, 3], 50)])
    drive_steps(sched, 1)
    sched.add_request("long", list(range(100, 150)), SamplingParams(max_tokens=3))
    drive_steps(sched, 1)
    sched.running.reverse()  # as if the long prompt had been admitted first
    assert [g.request_id for g in sched.running] == ["long", "a"]
    out, _ = step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1),
                                                                             ("long", 15)]


def test_request_swapped_mid_prefill_resumes_in_budget_sized_chunks() -> None:
    requests = [("a", [1, 2, 3], 30), ("b", list(range(100, 130)), 5)]
    big = make_scheduler(num_blocks=64, max_num_batched_tokens=64)
    submit(big, requests)
    expected = drive(big).outputs
    sched = make_scheduler(num_blocks=10, num_host_blocks=16, max_num_batched_tokens=4)
    submit(sched, requests)
    run = drive(sched)  # checks every step's batch against the budget
    swapped_out = [i for i, out in enumerate(run.steps) if only(out.swap_out)]
    assert [run.steps[i].preempted for i in swapped_out] == [["b"]]
    resumed = [i for i, out in enumerate(run.steps) if only(out.swap_in)]
    assert len(resumed) == 1
    assert [s.num_new_tokens for s in run.steps[resumed[0]].scheduled] == [4]
    assert run.outputs == expected
    assert_pool_all_free(sched)


def drive_steps(sched: Scheduler, steps: int) -> SchedulerOutput:
    for _ in range(steps):
        out, _ = step(sched)
    return out


def test_budget_splits_admissions_too() -> None:
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=8)
    submit(sched, [("a", list(range(5)), 4), ("b", list(range(20, 26)), 4)])
    out = sched.schedule()
    assert [(s.seq.request_id, s.num_new_tokens, s.samples) for s in out.scheduled] == [
        ("a", 5, True), ("b", 3, False)]
    assert out.num_batched_tokens == 8


def test_max_num_seqs_limits_admission() -> None:
    sched = make_scheduler(num_blocks=64, max_num_seqs=2)
    submit(sched, [(f"r{i}", [i, i, i], 4) for i in range(3)])
    out = sched.schedule()
    assert [s.seq.request_id for s in out.scheduled] == ["r0", "r1"]
    assert [g.request_id for g in sched.waiting] == ["r2"]


# ---------------------------------------------------------------------- abort
def test_abort_frees_at_once() -> None:
    sched = make_scheduler(num_blocks=32, num_host_blocks=8)
    submit(sched, [("keep", [1, 2, 3, 4, 5], 30)])
    drive_steps(sched, 2)  # keep: 7 tokens in its 2 blocks; the next 2 fit there too
    free_before = pool_of(sched).num_free_blocks
    assert free_before == 30
    sched.add_request("gone", list(range(40, 58)), SamplingParams(n=2, max_tokens=30))
    drive_steps(sched, 2)  # gone: prefilled, forked, one token each (a copy-on-write)
    group = sched.requests["gone"]
    assert [len(sched.kv.block_tables(s)[0]) for s in group.seqs] == [5, 5]
    assert pool_of(sched).num_free_blocks == free_before - 6
    assert sched.abort("gone") is group
    assert group.aborted and group.is_finished
    assert [s.finish_reason for s in group.seqs] == ["abort", "abort"]
    assert pool_of(sched).num_free_blocks == free_before
    assert "gone" not in sched.requests
    assert [g.request_id for g in sched.running] == ["keep"]
    assert sched.abort("gone") is None


def test_abort_a_waiting_request() -> None:
    sched = make_scheduler(num_blocks=8)
    submit(sched, [("w", [1, 2, 3], 5)])
    assert sched.abort("w").seqs[0].finish_reason == "abort"
    assert not sched.waiting and sched.requests == {} and not sched.has_work


def test_abort_a_swapped_request_frees_its_host_blocks() -> None:
    sched = make_scheduler(num_blocks=6, num_host_blocks=8)
    submit(sched, [("a", list(range(8)), 20), ("b", list(range(10, 18)), 20)])
    for _ in range(10):
        out, _ = step(sched)
        if sched.swapped:
            break
    assert [g.request_id for g in sched.swapped] == ["b"]
    assert out.preempted == ["b"] and only(out.swap_out)
    assert sched.requests["b"].seqs[0].status is SequenceStatus.SWAPPED
    assert len(pool_of(sched).host_refs) == 3
    sched.abort("b")
    assert not sched.swapped and pool_of(sched).host_refs == {}
    assert sorted(pool_of(sched).host_free) == list(range(8))
    sched.abort("a")
    assert_pool_all_free(sched)


# ------------------------------------------------------------- bad requests
def test_prompt_longer_than_the_context_is_refused() -> None:
    sched = make_scheduler(num_blocks=64, max_model_len=32)
    sched.add_request("fits", list(range(31)), SamplingParams())
    with pytest.raises(RequestTooLargeError) as info:
        sched.add_request("long", list(range(32)), SamplingParams())
    assert str(info.value) == (
        "The prompt has 32 tokens but the model's context holds 32 (including at least one "
        "reply token). Shorten the chat or start a new one.")
    assert isinstance(info.value, ValueError)
    assert "long" not in sched.requests


def test_prompt_longer_than_the_pool_is_refused() -> None:
    sched = make_scheduler(num_blocks=4)  # 16 slots
    sched.add_request("fits", list(range(15)), SamplingParams())
    with pytest.raises(RequestTooLargeError) as info:
        sched.add_request("big", list(range(16)), SamplingParams())
    assert str(info.value) == (
        "The prompt has 16 tokens but the whole KV pool holds 15 plus a reply token. "
        "Give the engine a larger KV cache budget or shorten the prompt.")


def test_empty_prompt_and_duplicate_id_are_refused() -> None:
    sched = make_scheduler(num_blocks=4)
    with pytest.raises(ValueError, match="at least one token"):
        sched.add_request("e", [], SamplingParams())
    sched.add_request("x", [1], SamplingParams())
    with pytest.raises(ValueError, match="request_id 'x' is already in use"):
        sched.add_request("x", [2], SamplingParams())


def test_bookkeeping_imports_neither_torch_nor_qt() -> None:
    code = ("import engine.core.kv_cache_manager, engine.core.scheduler, sys; "
            "assert 'torch' not in sys.modules and 'PySide6' not in sys.modules")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
