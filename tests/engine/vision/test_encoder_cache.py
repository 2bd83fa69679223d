"""EncoderCache: bounded in bytes, least recently used out first; ImageInputs' rows for
a chunk that holds part of an image."""

from __future__ import annotations

import torch

from engine.core.scheduler_output import ScheduledSeq
from engine.core.sequence import ImageSpan, Sequence
from engine.vision.inputs import EncoderCache, ImageInputs


def rows(n: int, fill: float) -> torch.Tensor:
    return torch.full((n, 4), float(fill))  # n * 16 bytes


def test_the_cache_is_bounded_and_keeps_the_recent():
    cache = EncoderCache(max_bytes=64)
    cache.put(b"a", rows(2, 1))
    cache.put(b"b", rows(2, 2))
    assert cache.get(b"a") is not None  # a is now the most recent
    cache.put(b"c", rows(2, 3))
    assert cache.get(b"b") is None and cache.get(b"a") is not None
    assert cache.nbytes == 64


class _Vision:
    image_token_id = 9

    def __init__(self):
        self.runs = 0

    def encode(self, data):
        self.runs += 1
        return torch.arange(5, dtype=torch.float32)[:, None].repeat(1, 4)


def test_a_chunk_takes_its_slice_of_one_encoding():
    vision = _Vision()
    inputs = ImageInputs(vision)
    # Tokens 2..8 hold an image: markers 7 at 2 and 5 between its five image tokens.
    seq = Sequence(0, "r", 0, [1, 1, 7, 9, 9, 7, 9, 9, 9, 1], 10)
    seq.images = (ImageSpan(2, 9, b"k" * 16, object()),)
    first = inputs.rows([ScheduledSeq(seq, 5, [[0]])])
    assert first[0].tolist() == [3, 4] and first[1][:, 0].tolist() == [0, 1]
    seq.num_computed_tokens = 5
    second = inputs.rows([ScheduledSeq(seq, 5, [[0]])])
    assert second[0].tolist() == [1, 2, 3] and second[1][:, 0].tolist() == [2, 3, 4]
    assert vision.runs == 1


def test_the_memory_figures_carry_the_encoded_images(tmp_path):
    from engine import LLM, SamplingParams
    from tests.engine.vision.tiny_idefics3 import png, save_tiny_idefics3

    with LLM(str(save_tiny_idefics3(tmp_path / "smolvlm")), num_gpu_blocks=64) as llm:
        assert llm.engine.memory_stats().encoder_cache_bytes == 0
        llm.chat([{"role": "user", "content": [{"type": "image", "image": png(1, (48, 40))}]}],
                 SamplingParams(max_tokens=1))
        # 5 frames (2 x 2 tiles and the global image) of 4 tokens, 64 float32 wide.
        assert llm.engine.memory_stats().encoder_cache_bytes == 5 * 4 * 64 * 4
