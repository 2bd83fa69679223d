"""A full block's cache key: a hash chain over the tokens, so a block's key names its
whole prefix, not just its own tokens."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence as Seq

from engine.core.sequence import Sequence


def hash_block(parent: bytes | None, token_ids: Seq[int]) -> bytes:
    """Stable across processes (unlike ``hash``): the parent's hash, then the tokens."""
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(b",".join(str(t).encode() for t in token_ids))
    return h.digest()


def extend_hashes(seq: Sequence, num_full: int, block_size: int) -> None:
    """``seq.block_hashes`` for its first ``num_full`` blocks, each computed once."""
    bs = block_size
    for i in range(len(seq.block_hashes), num_full):
        parent = seq.block_hashes[i - 1] if i else None
        seq.block_hashes.append(hash_block(parent, seq.token_ids[i * bs:(i + 1) * bs]))
