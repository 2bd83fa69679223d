"""A full block's cache key: a hash chain over the tokens, so a block's key names its
whole prefix, not just its own tokens. A block holding any of an image's placeholder
tokens is hashed with that image's content key too (``image_keys``): the same image
finds its blocks again, another image of the same size (the same placeholder tokens)
never does."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence as Seq

from engine.core.sequence import Sequence


def hash_block(parent: bytes | None, token_ids: Seq[int], extra: bytes = b"") -> bytes:
    """Stable across processes (unlike ``hash``): the parent's hash, then the tokens,
    then ``extra`` (the images' keys; empty for a text block, whose key is unchanged)."""
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(b",".join(str(t).encode() for t in token_ids))
    if extra:
        h.update(b"|images:" + extra)
    return h.digest()


def image_keys(seq: Sequence, start: int, end: int) -> bytes:
    """The content keys of the images with a token in ``[start, end)``, in order."""
    return b"".join(span.key for span in seq.images if span.start < end and start < span.end)


def block_images(seq: Sequence, start: int, end: int) -> tuple[tuple[int, int, bytes], ...]:
    """The images with a token in ``[start, end)``: (first, end, content key) of their
    tokens there, as offsets from ``start``."""
    return tuple((max(span.start, start) - start, min(span.end, end) - start, span.key)
                 for span in seq.images if span.start < end and start < span.end)


def extend_hashes(seq: Sequence, num_full: int, block_size: int) -> None:
    """``seq.block_hashes`` for its first ``num_full`` blocks, each computed once."""
    bs = block_size
    for i in range(len(seq.block_hashes), num_full):
        parent = seq.block_hashes[i - 1] if i else None
        seq.block_hashes.append(hash_block(parent, seq.token_ids[i * bs:(i + 1) * bs],
                                           image_keys(seq, i * bs, (i + 1) * bs)))
