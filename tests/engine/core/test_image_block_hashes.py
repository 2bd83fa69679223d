"""Block hashes with images: a block holding any of an image's tokens is keyed by the
image's content too; text blocks keep the keys they always had; a cached block's first
tokens are shared only with the same images."""

from __future__ import annotations

from engine.core.block_hashes import extend_hashes, hash_block
from engine.core.free_block_queue import Block
from engine.core.partial_blocks import shared_run
from engine.core.sequence import ImageSpan, Sequence

BS = 4
TOKENS = [1, 2, 3, 4, 5, 9, 9, 9, 9, 9, 9, 6, 7, 8]  # an image's tokens at 5..10


def seq(key: bytes | None) -> Sequence:
    s = Sequence(0, "r", 0, list(TOKENS), len(TOKENS))
    if key is not None:
        s.images = (ImageSpan(5, 11, key),)
    extend_hashes(s, len(TOKENS) // BS, BS)
    return s


def test_text_blocks_keep_their_keys():
    text = seq(None)
    assert text.block_hashes[0] == hash_block(None, TOKENS[:4])
    assert seq(b"A" * 16).block_hashes[0] == text.block_hashes[0]  # before the image


def test_blocks_holding_an_image_are_keyed_by_it():
    a, a_again, b = seq(b"A" * 16), seq(b"A" * 16), seq(b"B" * 16)
    assert a.block_hashes == a_again.block_hashes
    # Blocks 1 and 2 hold image tokens; same ids, another image: no block after the
    # first text block is shared (block 3 chains on them).
    assert all(x != y for x, y in zip(a.block_hashes[1:], b.block_hashes[1:], strict=True))
    assert a.block_hashes[1] != seq(None).block_hashes[1]


def test_a_cached_blocks_first_tokens_are_shared_only_with_the_same_images():
    block = Block(0, token_ids=(5, 9, 9, 9), images=((1, 4, b"A" * 16),))
    tokens = (5, 9, 9)
    assert shared_run(block, tokens, ((1, 3, b"A" * 16),)) == 3
    # Same ids, another image (or none): only the text token before it.
    assert shared_run(block, tokens, ((1, 3, b"B" * 16),)) == 1
    assert shared_run(block, tokens, ()) == 1
    # An image ending inside the run on both sides, the same: kept; after it, text.
    two = Block(1, token_ids=(9, 9, 5, 6), images=((0, 2, b"A" * 16),))
    assert shared_run(two, (9, 9, 5), ((0, 2, b"A" * 16),)) == 3
    assert shared_run(two, (9, 9, 5), ((0, 2, b"C" * 16),)) == 0
