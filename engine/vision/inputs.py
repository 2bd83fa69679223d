"""A step's image embeddings: which rows of the step's flattened tokens are image tokens,
and the embeddings that replace their token embeddings.

An image is encoded whole, once, the first time a prefill chunk reaches any of its
tokens, and kept in ``EncoderCache`` under its content key; a chunk that holds only part
of an image takes its slice of the cached rows, so chunked prefill never splits one
image across two encoder runs. The cache is bounded in bytes (least recently used out
first); a sequence keeps its image's frames (``ImageSpan.data``), so an image evicted
before its prompt is done is encoded again, never lost.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from engine.core.scheduler_output import ScheduledSeq
from engine.core.sequence import ImageSpan
from engine.vision.model import VisionModel

DEFAULT_CACHE_BYTES = 256 * 2**20


class EncoderCache:
    """Image embeddings by content key, at most ``max_bytes`` of them (one larger image
    is still kept, alone)."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("encoder cache bytes must be >= 0")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.nbytes = 0
        self.encoded = 0  # encoder runs, for tests and the bench

    def get(self, key: bytes) -> torch.Tensor | None:
        rows = self._entries.get(key)
        if rows is not None:
            self._entries.move_to_end(key)
        return rows

    def put(self, key: bytes, rows: torch.Tensor) -> None:
        size = rows.numel() * rows.element_size()
        while self._entries and self.nbytes + size > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.nbytes -= old.numel() * old.element_size()
        self._entries[key] = rows
        self.nbytes += size


class ImageInputs:
    """The runner's hook: ``rows(scheduled)`` for a step (None when it holds no image
    token)."""

    def __init__(self, vision: VisionModel, cache: EncoderCache | None = None) -> None:
        self.vision = vision
        self.cache = cache or EncoderCache()

    def embeddings(self, span: ImageSpan) -> torch.Tensor:
        rows = self.cache.get(span.key)
        if rows is None:
            rows = self.vision.encode(span.data)
            self.cache.encoded += 1
            self.cache.put(span.key, rows)
        return rows

    def rows(self, scheduled: Sequence[ScheduledSeq]
             ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(row indices int64 [R], embeddings [R, width]) of the step's image tokens,
        rows counted in the step's flattened order."""
        index: list[int] = []
        parts: list[torch.Tensor] = []
        offset = 0
        image_id = self.vision.image_token_id
        for item in scheduled:
            seq = item.seq
            start = seq.num_computed_tokens
            end = start + item.num_new_tokens
            for span in seq.images:
                lo, hi = max(start, span.start), min(end, span.end)
                if lo >= hi:
                    continue
                tokens = seq.token_ids[span.start:span.end]
                # The image's embedding rows belong to its image tokens, in order (a
                # split image's row markers between them are text).
                before = sum(1 for t in tokens[:lo - span.start] if t == image_id)
                mine = [p for p in range(lo, hi) if tokens[p - span.start] == image_id]
                if not mine:
                    continue
                index += [offset + p - start for p in mine]
                parts.append(self.embeddings(span)[before:before + len(mine)])
            offset += item.num_new_tokens
        if not index:
            return None
        device = parts[0].device
        return torch.tensor(index, dtype=torch.int64, device=device), torch.cat(parts)

    @staticmethod
    def key_ends(scheduled: Sequence[ScheduledSeq]) -> list[int] | None:
        """Each row's key limit (AttentionMetadata.key_ends) for a step that holds a
        bidirectional image run (``ImageSpan.joint``), in the step's flattened order;
        None for a step without one (every row causal). The scheduler keeps a run's
        uncomputed tokens in one chunk, so its end is among the step's keys."""
        ends: list[int] = []
        joint = False
        for item in scheduled:
            seq = item.seq
            start = seq.num_computed_tokens
            end = start + item.num_new_tokens
            row_ends = list(range(start + 1, end + 1))
            for span in seq.images:
                if span.joint is None:
                    continue
                lo, hi = max(start, span.joint[0]), min(end, span.joint[1])
                if lo >= hi:
                    continue
                if span.joint[1] > end:
                    raise RuntimeError(f"{seq.label}: the chunk [{start}, {end}) cuts the "
                                       f"image run {span.joint}")
                row_ends[lo - start:hi - start] = [span.joint[1]] * (hi - lo)
                joint = True
            ends += row_ends
        return ends if joint else None

