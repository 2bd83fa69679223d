"""One candidate's reply as it streams: its text so far, the detokenizer and stop-string
check that produce it, when its tokens came, and its log-probabilities when asked for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.outputs import TokenLogprobs
from engine.text.detokenizer import IncrementalDetokenizer
from engine.text.stop import StopChecker


@dataclass(slots=True)
class CandidateText:
    detokenizer: IncrementalDetokenizer
    stop: StopChecker
    text: str = ""
    first_token_time: float | None = None
    finish_time: float | None = None
    logprobs: list[TokenLogprobs] | None = None  # one per token, when the request asks

    @classmethod
    def start(cls, tokenizer, prompt_ids: Sequence[int], stop: Sequence[str],
              with_logprobs: bool, skip_special_tokens: bool = True) -> CandidateText:
        detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)
        return cls(detokenizer, StopChecker(list(stop)),
                   logprobs=[] if with_logprobs else None)

    def drain(self) -> str:
        """The text still held back when the candidate ends for another reason than a stop
        string: half a character in the detokenizer, a possible stop-string prefix."""
        stopped, text = self.stop.check(self.detokenizer.flush())
        return text if stopped else text + self.stop.flush()
