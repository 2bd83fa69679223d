"""Block hashes with images: a block holding any of an image's tokens is keyed by the
image's content too; text blocks keep the keys they always had."""

from __future__ import annotations

from engine.core.block_hashes import extend_hashes, hash_block
from engine.core.partial_blocks import candidates
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


def test_partial_candidates_carry_the_image_key():
    a, b = seq(b"A" * 16), seq(b"B" * 16)
    # After a hit of one block the candidates start at token 4: of 3 and 2 tokens they
    # hold image tokens, of 1 token (token 4) they do not.
    keys_a = {num: key for num, key, _ in candidates(a, BS, BS)}
    keys_b = {num: key for num, key, _ in candidates(b, BS, BS)}
    assert sorted(keys_a) == [1, 2, 3]
    assert keys_a[3] != keys_b[3] and keys_a[2] != keys_b[2] and keys_a[1] == keys_b[1]
