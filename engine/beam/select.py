"""One beam search step's choice, for one prompt: which continuations run on, which
finish, and whether the search is over. Pure: no blocks, no sequences; the searcher
(engine/beam/searcher.py) turns the choice into forks and frees.

The rules are transformers' ``generate(num_beams=W, do_sample=False)`` (its
``_beam_search``), so the two agree beam for beam:

- every running beam's next-token log-probabilities (log-softmax, float32) plus its
  cumulative log-probability are ranked together; the top ``K = max(2, 1 + stops) * W``
  are the step's candidates (so W of them can always run on, whatever number end);
- a candidate ends on a stop token or string, at ``max_tokens`` or at the context's
  end; an ending candidate ranked among the first W becomes a finished hypothesis
  scored ``cumulative / length ** length_penalty`` (length counting its last token);
  the finished set keeps the best W;
- the best W candidates that did not end run on, best first;
- the search is over when all W finished slots are full and no running beam can beat
  the worst of them (judged at the current length, or at ``max_tokens`` for
  ``early_stopping="never"`` with a positive penalty), when W beams finished with
  ``early_stopping=True``, or when every candidate ended.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.beam.params import BeamSearchParams


@dataclass(slots=True)
class Hypothesis:
    """A finished beam: its generated ids (the stop token included), summed
    log-probability and length-penalized score."""

    token_ids: list[int]
    cumulative_logprob: float
    score: float
    finish_reason: str


@dataclass(slots=True, frozen=True)
class Continuation:
    """A candidate that runs on: running beam ``parent`` (its position in the running
    list) extended by ``token``, with the new cumulative log-probability."""

    parent: int
    token: int
    cumulative_logprob: float


@dataclass(slots=True)
class BeamChoice:
    running: list[Continuation]
    done: bool


@dataclass(slots=True)
class BeamSelector:
    params: BeamSearchParams
    stop_ids: frozenset[int]  # the ids that end a beam (EOS unless ignored, stop tokens)
    finished: list[Hypothesis] = field(default_factory=list)  # best first, at most W
    num_generated: int = 0  # tokens each running beam has generated

    def step(self, logprobs: torch.Tensor, cumulative: list[float],
             outputs: list[list[int]], ends: Callable[[int, int], str | None]) -> BeamChoice:
        """``logprobs`` [B, V] float32: each running beam's next-token log-probabilities,
        in the running order; ``cumulative`` and ``outputs`` (generated ids) of the same
        beams. ``ends(parent, token)`` says why a candidate ends ("stop", "length",
        "context") or None; it is asked only of the step's candidates."""
        width = self.params.beam_width
        num_beams, vocab = logprobs.shape
        scores = logprobs + torch.tensor(cumulative, dtype=torch.float32)[:, None]
        k = min(max(2, 1 + len(self.stop_ids)) * width, num_beams * vocab)
        top_scores, top_index = torch.topk(scores.reshape(-1), k)
        self.num_generated += 1
        length = self.num_generated
        penalty = float(length) ** self.params.length_penalty
        slots_full = len(self.finished) == width and self.params.early_stopping is True
        running: list[Continuation] = []
        ended_all = True
        for rank, (score, flat) in enumerate(zip(top_scores.tolist(), top_index.tolist(),
                                                 strict=True)):
            parent, token = divmod(flat, vocab)
            reason = ends(parent, token)
            if reason is None:
                ended_all = False
                if len(running) < width:
                    running.append(Continuation(parent, token, score))
            elif rank < width and not slots_full:
                # transformers divides in float32 too: the scores compare alike.
                normed = float(torch.tensor(score, dtype=torch.float32)
                               / torch.tensor(penalty, dtype=torch.float32))
                self.add(Hypothesis([*outputs[parent], token], score, normed, reason))
        done = ended_all or not running or self._cannot_improve(running[0].cumulative_logprob)
        if self.params.early_stopping is True and len(self.finished) == width:
            done = True
        return BeamChoice(running, done)

    def add(self, hyp: Hypothesis) -> None:
        self.finished.append(hyp)
        # Stable: among equal scores the earlier finished stays ahead, as transformers'
        # merge keeps its finished slots before the step's candidates.
        self.finished.sort(key=lambda h: -h.score)
        del self.finished[self.params.beam_width:]

    def _cannot_improve(self, best_running: float) -> bool:
        """The early-stop heuristic: once every slot is finished, whether the best
        running beam could still score above the worst finished one."""
        p = self.params
        if len(self.finished) < p.beam_width:
            return False
        if p.early_stopping == "never" and p.length_penalty > 0.0:
            length = p.max_tokens
        else:
            length = self.num_generated
        best = float(torch.tensor(best_running, dtype=torch.float32)
                     / torch.tensor(float(length) ** p.length_penalty, dtype=torch.float32))
        return not best > self.finished[-1].score
