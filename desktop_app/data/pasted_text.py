"""Long pasted text, folded: what counts as long, how a draft's pasted blocks join the
typed words into the message that is sent, and how a stored message splits again into
the words shown as written and the block shown folded.

Nothing about the fold is stored: the message keeps its full text (the model reads all
of it) and the fold is derived from that text each time it is shown, so a chat reopened
after a restart folds the same way. The composer puts the typed words first, one blank
line, then the pasted blocks; `split_message` reads that back. A message typed by hand
over the threshold folds too (it cannot be told from a paste, and is as long).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FOLD_CHARS = 1_500  # a paste longer than this folds (about 20 lines of prose or code)
LEAD_CHARS = 500  # typed words before a paste longer than this fold with it


def should_fold(text: str) -> bool:
    return len(text) > FOLD_CHARS


@dataclass(slots=True, frozen=True)
class SplitMessage:
    """A message as shown: `lead` as written, then `pasted` folded ("" if none)."""

    lead: str
    pasted: str


def split_message(text: str) -> SplitMessage:
    """The inverse of `join_draft` for a draft whose typed words are one paragraph: a
    short first paragraph shows as written above the fold, the rest folds."""
    if not should_fold(text):
        return SplitMessage(text, "")
    head, blank, rest = text.partition("\n\n")
    if blank and len(head) <= LEAD_CHARS and should_fold(rest):
        return SplitMessage(head, rest)
    return SplitMessage("", text)


def join_draft(typed: str, pasted: Sequence[str]) -> str:
    """The message a draft sends: the typed words, then each pasted block, a blank line
    between them (empty parts left out)."""
    parts = [typed.strip(), *(block.strip("\n") for block in pasted)]
    return "\n\n".join(part for part in parts if part.strip())


def fold_label(text: str, tokens: int | None) -> str:
    """"Pasted text · 5,839 tokens" (counted by the loaded model's tokenizer), or its size
    in characters when no tokenizer can count it."""
    size = f"{tokens:,} tokens" if tokens is not None else f"{len(text):,} characters"
    return f"Pasted text · {size}"
