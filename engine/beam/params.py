"""Beam search settings, validated when built."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams
from engine.validation import FieldChecker

_check = FieldChecker("BeamSearchParams")
MAX_BEAM_WIDTH = 64  # each beam is a running sequence of the batch
EARLY_STOPPING = (False, True, "never")


@dataclass(slots=True)
class BeamSearchParams:
    """Deterministic beam search (engine/beam/select.py), with transformers' meaning of
    ``length_penalty`` (a finished beam's score is its summed log-probability over its
    length ** length_penalty) and ``early_stopping`` (True: stop once ``beam_width``
    beams finished; False: once no running beam can beat the worst finished one, judged
    at the current length; "never": judged at ``max_tokens`` when the penalty rewards
    length). A beam finishes at an end-of-sequence token (unless ``ignore_eos``), a
    ``stop_token_ids`` token, a ``stop`` string, or ``max_tokens``."""

    beam_width: int
    max_tokens: int
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    # How many of the finished beams come back, best first (None: all beam_width).
    num_returned: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        _check.types(self, integers=("beam_width", "max_tokens"), numbers=("length_penalty",))
        _check(1 <= self.beam_width <= MAX_BEAM_WIDTH, "beam_width", self.beam_width,
               f"an integer in [1, {MAX_BEAM_WIDTH}]")
        _check(self.max_tokens is not None and self.max_tokens >= 1, "max_tokens",
               self.max_tokens, "an integer >= 1")
        _check(any(self.early_stopping is v for v in EARLY_STOPPING), "early_stopping",
               self.early_stopping, "False, True or 'never'")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", self.stop,
               "a list of non-empty strings")
        _check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
               "stop_token_ids", self.stop_token_ids, "a list of token ids >= 0")
        _check(isinstance(self.ignore_eos, bool), "ignore_eos", self.ignore_eos, "True or False")
        _check(self.num_returned is None or (isinstance(self.num_returned, int)
                                             and 1 <= self.num_returned <= self.beam_width),
               "num_returned", self.num_returned, "None or an integer in [1, beam_width]")

    @property
    def response_format(self) -> None:
        """A beam search's reply is free text (the worker asks whether to compile a
        grammar first)."""
        return None

    def scheduling(self) -> SamplingParams:
        """What the scheduler keeps of it: one sequence to start, that never forks by
        itself (the beams fork as the search picks them)."""
        return SamplingParams(n=1, temperature=0.0, max_tokens=self.max_tokens,
                              stop=list(self.stop), stop_token_ids=list(self.stop_token_ids),
                              ignore_eos=self.ignore_eos,
                              skip_special_tokens=self.skip_special_tokens)
