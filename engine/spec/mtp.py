"""Drafts from the model's own multi-token-prediction head (Qwen3.5's ``mtp.*``,
engine/models/qwen35_mtp.py), run in the same engine with a paged KV cache and a
scheduler of its own, as a draft model's (engine/spec/draft_model.py).

The head at position i reads the target's final-norm hidden state at i and token i + 1,
and guesses token i + 2. Each speculating candidate of the target has a mirror here: a
request of the head's whose token j is the candidate's token j + 1, so the mirror's
position j is the head's position j, and its K/V blocks hash as a chain over the tokens
they read (all but the candidate's first, which every chat of a model shares).

- the target's hidden states come from each target forward (`ModelRunner.hidden_sink`)
  and are kept per candidate until its mirror has read them (engine/spec/mtp_rows.py);
- before a verify step a mirror catches up over the candidate's newly computed tokens,
  reading the target's rows; its last row gives the first draft, and each further draft
  feeds the head's own output at the position before, one forward per draft, every
  mirror in one batch;
- draft positions' K/V is never committed to the head's prefix cache (it was computed
  from the head's own hidden state, not the target's), and after drafting every mirror is
  cut back to the positions read from the target's rows (`Scheduler.rewind`), so the
  drafts' blocks go back at once and a verify step's kept drafts are read again from the
  target's rows the next time.

After an image (Qwen3.5's M-RoPE), a mirror carries its candidate's image spans, so the
head reads every index at the target's position there, and it embeds an image's tokens
as the image's rows from the target's encoder cache (`_shifted`), as the target did.

Greedy drafts make the proposal one-hot, so engine/spec/verify.py's rule keeps the
target's distribution. Where the target did not compute a position (a prefix-cache hit
the head's own cache does not have, up to a block at a chat's new turn), the head reads
zeros there: its drafts are then poorer, the reply the same.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import ScheduledSeq, SchedulerOutput
from engine.core.sequence import Request, Sequence, SequenceStatus, common_prefix
from engine.models.qwen35_mtp import MTPHead, build_mtp_head
from engine.runner.kv_cache import KVShape
from engine.runner.model_runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.spec.mtp_rows import HiddenRows

# The most head forwards one proposal may take (a long catch-up's chunks count).
_MAX_FORWARDS = 64


class HeadRunner(ModelRunner):
    """A ModelRunner whose model is an MTP head: each step also takes the rows of the
    target's hidden states, and gives back the head's own at the sampled rows."""

    @torch.inference_mode()
    def run(self, out: SchedulerOutput, target_hidden: torch.Tensor
            ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(float32 logits, head hidden states) of the sampled rows, or (None, None)."""
        self.apply_block_moves(out)
        if not out.scheduled:
            return None, None
        input_ids, positions, metas, sample_rows = self.prepare(out)
        layers = [(k, v, metas[g]) for g, k, v in self._layer_views]
        embeds = self.images.rows([_shifted(item) for item in out.scheduled]) \
            if self.images is not None else None
        hidden = self.model(input_ids, positions, target_hidden, layers, metas[0], self.backend,
                            image_embeds=embeds)
        if not sample_rows:
            return None, None
        hidden = hidden[sample_rows]
        return self.model.compute_logits(hidden), hidden


@dataclass(slots=True, frozen=True)
class _ShiftedStep:
    """What ``ImageInputs.rows`` reads of a scheduled mirror (``seq``, ``num_new_tokens``)."""

    seq: Sequence
    num_new_tokens: int


def _shifted(item: ScheduledSeq) -> ScheduledSeq | _ShiftedStep:
    """A mirror's step as the target's image rows see it: mirror index j holds token
    j + 1, so an image at the candidate's [s, e) has its tokens at the mirror's
    [s - 1, e - 1) (the image's rows, its content key the same). Its ``images`` stay
    unshifted on the mirror itself: they give positions and block keys."""
    seq = item.seq
    spans = tuple(replace(span, start=span.start - 1, end=span.end - 1)
                  for span in seq.images if span.start > 0)
    if not spans:
        return item
    view = Sequence(seq.seq_id, seq.request_id, seq.index, seq.token_ids,
                    seq.num_prompt_tokens, seq.num_computed_tokens, images=spans)
    return _ShiftedStep(view, item.num_new_tokens)


@dataclass(slots=True)
class _Mirror:
    seq: Sequence
    owner: int  # the target candidate's seq_id
    valid: int = 0  # positions whose head K/V was computed from the target's rows
    target_end: int = 0  # this round: positions below it read the target's rows
    first: int = 0  # where this round's drafts start in the mirror's tokens
    last_out: torch.Tensor | None = None  # the head's output at its last position [1, H]


class MTPProposer:
    method = "mtp"

    def __init__(self, head: MTPHead, runner: HeadRunner, scheduler: Scheduler,
                 target_runner: ModelRunner, vocab_size: int) -> None:
        self.head = head
        self.runner = runner
        self.scheduler = scheduler
        self.vocab_size = vocab_size
        self.weights_bytes = head.weight_bytes()
        self._zeros = torch.zeros(1, head.spec.hidden_size, dtype=head.dtype,
                                  device=runner.device)
        self._tracked: dict[str, Request] = {}  # target request id -> its request
        self._rows: dict[int, HiddenRows] = {}  # target seq_id -> its unread rows
        self._mirrors: dict[int, _Mirror] = {}  # target seq_id -> its mirror
        self._by_mirror: dict[int, _Mirror] = {}  # mirror seq_id -> the same
        self._params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
        target_runner.hidden_sink = self.capture

    # ------------------------------------------------------------ target rows
    def track(self, request: Request) -> None:
        """Keep the hidden states of ``request``'s candidates from now on."""
        self._tracked[request.request_id] = request

    def capture(self, out: SchedulerOutput, hidden: torch.Tensor) -> None:
        """A target forward's final-norm hidden states, rows in ``out.scheduled`` order."""
        row = 0
        for item in out.scheduled:
            seq, n = item.seq, item.num_new_tokens
            if seq.request_id in self._tracked:
                rows = self._rows.setdefault(seq.seq_id, HiddenRows())
                rows.put(seq.num_computed_tokens, hidden[row:row + n])
            row += n

    def _fork_rows(self) -> None:
        """A candidate forked after the prompt has no rows of its own: its parent's
        rows of the shared prompt."""
        for request in self._tracked.values():
            for seq in request.live_seqs:
                if seq.seq_id in self._rows:
                    continue
                parent = next((self._rows[s.seq_id] for s in request.seqs
                               if s.seq_id in self._rows), None)
                self._rows[seq.seq_id] = parent.copy_below(seq.num_prompt_tokens) \
                    if parent is not None else HiddenRows()

    # ---------------------------------------------------------------- mirrors
    def _mirror(self, seq: Sequence) -> _Mirror | None:
        tokens = seq.token_ids[1:seq.num_computed_tokens + 1]
        mirror = self._mirrors.get(seq.seq_id)
        if mirror is not None and mirror.seq.is_finished:
            self.drop(seq, keep_rows=True)  # the head's pool ended it: start it again
            mirror = None
        if mirror is None:
            if not tokens:
                return None
            try:
                request = self.scheduler.add_request(f"mtp:{seq.label}:{seq.seq_id}",
                                                     tokens, self._params)
            except ValueError:
                return None  # longer than the head's pool: no drafts
            # The candidate's image spans, as they are: mirror index j takes the target's
            # position of index j (M-RoPE's shifted ones after an image, engine/core/
            # mrope.py), and its blocks hash with the image's key over the same indices.
            # (Index s - 1 before an image at s reads the image's first row too
            # (`_shifted`); a block ending there is keyed without it: a hit on another
            # image there costs a draft's quality only, the target verifies.)
            request.seqs[0].images = seq.images
            mirror = self._mirrors[seq.seq_id] = _Mirror(request.seqs[0], seq.seq_id)
            self._by_mirror[mirror.seq.seq_id] = mirror
        else:
            common = common_prefix(mirror.seq.token_ids, tokens)
            if common < mirror.seq.num_tokens:
                if common == 0:
                    self.drop(seq, keep_rows=True)
                    return self._mirror(seq)
                self.scheduler.rewind(mirror.seq, common)
            mirror.seq.token_ids += tokens[mirror.seq.num_tokens:]
        mirror.valid = min(mirror.valid, mirror.seq.num_computed_tokens)
        mirror.target_end = mirror.first = len(tokens)
        mirror.last_out = None
        return mirror

    def drop(self, seq: Sequence, keep_rows: bool = False) -> None:
        """The target candidate ended: its mirror's blocks go back (cached)."""
        mirror = self._mirrors.pop(seq.seq_id, None)
        if not keep_rows:
            self._rows.pop(seq.seq_id, None)
        if mirror is not None:
            self._by_mirror.pop(mirror.seq.seq_id, None)
            self.scheduler.abort(mirror.seq.request_id)

    def drop_request(self, request_id: str) -> None:
        request = self._tracked.pop(request_id, None)
        for seq in request.seqs if request is not None else ():
            self.drop(seq)

    # ----------------------------------------------------------------- drafts
    def propose(self, wanted: list[tuple[Sequence, int]]) -> dict[int, list[int]]:
        """Up to k greedy drafts for each (target candidate, k), by target seq_id."""
        self._fork_rows()
        active: dict[int, tuple[_Mirror, int]] = {}
        for seq, k in wanted:
            mirror = self._mirror(seq) if k > 0 else None
            if mirror is not None and mirror.seq.num_uncomputed_tokens:
                active[seq.seq_id] = (mirror, k)
        for _ in range(_MAX_FORWARDS):
            if all(m.seq.num_tokens - m.first >= k for m, k in active.values()):
                break
            out = self.scheduler.schedule()
            if out.is_empty:
                break
            logits, hidden = self.runner.run(out, self._inputs(out))
            self._mark_computed(out)
            if logits is not None and hidden is not None:
                sampled = [item.seq for item in out.scheduled if item.samples]
                tokens = logits[:, :self.vocab_size].argmax(dim=-1).tolist()
                for i, (mseq, token) in enumerate(zip(sampled, tokens, strict=True)):
                    mseq.append_token(token)
                    self._by_mirror[mseq.seq_id].last_out = hidden[i:i + 1]
            self.scheduler.remove_finished()
        drafts = {s: m.seq.token_ids[m.first:m.first + k] for s, (m, k) in active.items()}
        for mirror, _k in active.values():
            self._cut_back(mirror)
        return drafts

    def _inputs(self, out: SchedulerOutput) -> torch.Tensor:
        """The hidden state each scheduled row reads: the target's row below the round's
        target end, else (a draft) the head's own output at the position before."""
        parts = []
        for item in out.scheduled:
            mirror = self._by_mirror[item.seq.seq_id]
            start = item.seq.num_computed_tokens
            stop = start + item.num_new_tokens
            rows = self._rows.get(mirror.owner) or HiddenRows()
            parts.append(rows.gather(range(start, min(stop, mirror.target_end)), self._zeros))
            if stop > mirror.target_end:
                parts.append(mirror.last_out if mirror.last_out is not None else self._zeros)
        return torch.cat(parts)

    def _mark_computed(self, out: SchedulerOutput) -> None:
        """Only K/V read from the target's rows joins the head's prefix cache."""
        for item in out.scheduled:
            mseq = item.seq
            mseq.num_computed_tokens += item.num_new_tokens
            mirror = self._by_mirror[mseq.seq_id]
            if mseq.num_computed_tokens <= mirror.target_end:
                self.scheduler.kv.commit_computed(mseq)
                mirror.valid = mseq.num_computed_tokens
                if mirror.owner in self._rows:
                    self._rows[mirror.owner].drop_before(mirror.valid)

    def _cut_back(self, mirror: _Mirror) -> None:
        """The drafts' tokens and blocks go; the mirror waits, fully computed."""
        if mirror.seq.status is not SequenceStatus.RUNNING or mirror.valid == 0:
            return  # preempted by the head's pool, or never caught up
        self.scheduler.rewind(mirror.seq, mirror.valid)
        mirror.valid = mirror.seq.num_computed_tokens


def build_mtp(parts) -> MTPProposer:
    """The MTP proposer of an engine's assembled ``parts`` (engine/build.py): the head
    loaded from ``parts.mtp_weights``, a pool of one layer with as many blocks as the
    target's full-attention group, the target's device, KV dtype and budget."""
    config = parts.config
    target = parts.runner
    head = build_mtp_head(target.model, parts.hf_config, parts.model_name,
                          parts.mtp_weights or {})
    shape = KVShape.of_model(head, config.block_size, target.shape.dtype)
    groups = [KVGroupSpec(tuple(range(len(head.layers))))]
    counts = [parts.kv_cache.pools[0].num_blocks]
    # The target's image rows (its encoder cache): the head embeds an image's tokens as
    # the target did.
    runner = HeadRunner(head, shape, groups, counts, 0, target.backend, target.device,
                        cuda_graphs=False, max_model_len=parts.max_model_len,
                        images=target.images, max_num_seqs=config.max_num_seqs)
    kv = KVCacheManager.build(groups, counts, config.block_size,
                              enable_prefix_caching=config.enable_prefix_caching,
                              group_block_bytes=[shape.block_bytes(groups[0].layers)],
                              lookahead=config.max_num_batched_tokens)
    # A freed mirror's partial last block may hold draft positions: never cached.
    kv.reuse_partial = False
    scheduler = Scheduler(kv, config.max_num_seqs, config.max_num_batched_tokens,
                          parts.max_model_len)
    return MTPProposer(head, runner, scheduler, target, parts.tokenizer.vocab_size)
