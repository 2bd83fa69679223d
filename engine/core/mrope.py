"""Token positions for a text model with multimodal rotary positions (M-RoPE: Qwen3.5),
read from a sequence's images, as transformers' ``get_rope_index`` computes them.

A text token has one position for all three rotary axes (time, height, width); an
image's ``rows x cols`` tokens (its ``ImageSpan.grid``) all share the time position of
the image's first token and spread over height and width from it: token j of an image
starting at text position s sits at (s, s + j // cols, s + j % cols). The text after the
image goes on from the image's largest position + 1, that is from s + max(rows, cols),
so every token after it sits ``rows * cols - max(rows, cols)`` places before its index.

Positions are a function of the sequence's token index and its spans only, so a chunked
prefill, a decode step, a prefix-cache hit, a preemption's recompute and a fork all see
the same ones. A sequence without a gridded image keeps positions = indices, and the
runner never calls here for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.sequence import ImageSpan


def has_grid(spans: Sequence[ImageSpan]) -> bool:
    return any(span.grid is not None for span in spans)


def shift_at(spans: Sequence[ImageSpan], index: int) -> int:
    """How far before ``index`` a text token at ``index`` sits (>= 0): the images that
    end at or before it, each ``rows * cols - max(rows, cols)``."""
    return sum(_shrink(span) for span in spans
               if span.grid is not None and span.end <= index)


def positions(spans: Sequence[ImageSpan], start: int,
              end: int) -> tuple[list[int], list[int], list[int]] | list[int]:
    """The positions of tokens ``[start, end)``: one list when none of them is an image
    token (text positions, shifted by the images before them), else (time, height,
    width) lists."""
    gridded = [s for s in spans if s.grid is not None]
    inside = [s for s in gridded if s.start < end and start < s.end]
    if not inside:  # the common case: a decode step, a chunk of text
        base = shift_at(gridded, start)
        return list(range(start - base, end - base))
    t: list[int] = []
    h: list[int] = []
    w: list[int] = []
    shift = 0
    p = start
    for span in gridded:
        if span.end <= start:
            shift += _shrink(span)
            continue
        if span.start >= end:
            break
        # Text before the image, then the image's own tokens in this range.
        text = range(p - shift, min(span.start, end) - shift)
        t += text
        h += text
        w += text
        p = max(p, span.start)
        rows, cols = span.grid
        origin = span.start - shift
        for j in range(p - span.start, min(span.end, end) - span.start):
            t.append(origin)
            h.append(origin + j // cols)
            w.append(origin + j % cols)
        p = min(span.end, end)
        shift += _shrink(span) if span.end <= end else 0
    text = range(p - shift, end - shift)
    t += text
    h += text
    w += text
    return t, h, w


def _shrink(span: ImageSpan) -> int:
    rows, cols = span.grid
    return rows * cols - max(rows, cols)
