"""The block map's image marks: a block is marked where a holder's image tokens lie."""

from __future__ import annotations

from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.sequence import ImageSpan, Sequence


def test_blocks_holding_image_tokens_are_marked():
    kv = KVCacheManager.build([KVGroupSpec((0,))], [8], 4)
    seq = Sequence(0, "r", 0, list(range(14)), 14)
    seq.images = (ImageSpan(5, 9, b"k"),)  # tokens 5-8: blocks 1 and 2
    assert kv.allocate(seq) is not None
    stats = kv.stats([seq])
    table = kv.block_tables(seq)[0]
    marked = {info.block_id for info in stats.blocks if info.image}
    assert marked == {table[1], table[2]}
    plain = Sequence(1, "p", 0, list(range(100, 110)), 10)
    assert kv.allocate(plain) is not None
    assert {info.block_id for info in kv.stats([seq, plain]).blocks if info.image} == marked
