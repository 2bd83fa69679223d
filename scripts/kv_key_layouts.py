"""What quantized keys lose in other layouts than the pool's rows: per-token rows (the
int4 and int8 formats) against per-channel groups over a block's tokens (KIVI's layout for
keys), their parameters as float16 or coded in fewer bits, measured on the starter as
`folio bench kv` measures a format (teacher-forced mean KL over the same 2,048 tokens,
greedy 48-token replies after ~1,100 words, both against a float16 pool in the same run).
Values stay in their format's rows throughout: int4's error is in its keys.

Each layout is simulated, not stored: the engine (float32 weights) runs the PyTorch
backend over a float32 pool, and every KV write puts in the values a layout's
encode-then-decode gives. A per-channel layout needs the tokens of a whole block to choose
its parameters, so each write re-encodes the blocks it touches over their rows so far,
from the rows' exact values (kept beside the pool and copied with the block when the
engine copies one; a block swapped back in starts again from its decoded rows): what a
pool that keeps its open blocks' exact keys aside would hold. ``--append decoded``
re-encodes from the decoded rows instead, as a pool with no such store must.

    python scripts/kv_key_layouts.py --layouts int4-rows,int4-channels11 --block-size 32

Bytes per token count what each layout would store (codes, scales, a block's key
parameters shared among its rows), against float16's, with K and V rows of their own
lengths and of one length (the pool's today); results are in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's Folio

from engine.bench import kv_quality  # noqa: E402
from engine.bench.kv_text import QUESTIONS, TEXT, leading_paragraphs  # noqa: E402
from engine.bench.setup import folio_config  # noqa: E402
from engine.llm import LLM  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from kernels.kv_format import format_named, int4_group  # noqa: E402
from kernels.reference.backend import TorchBackend  # noqa: E402

INT4, INT8 = format_named("int4"), format_named("int8")


def format_rows(fmt):
    """[T, nkv, hd] through ``fmt``'s rows and back (unrotated)."""
    return lambda rows: fmt.rotate(fmt.decode(fmt.encode(rows)))


def channels(levels: int):
    """[n, nkv, hd]: each channel of each head over the n tokens, ``levels`` + 1 codes
    from its minimum; the minimum and the step as float16."""
    def encode(rows: torch.Tensor) -> torch.Tensor:
        lo = rows.amin(0, keepdim=True).half().float()
        step = ((rows.amax(0, keepdim=True) - lo) / levels).half().float()
        step = torch.where(step > 0, step, torch.ones_like(step))
        return ((rows - lo) / step).round().clamp(0, levels) * step + lo
    return encode


def coded_channels(levels: int, mid_bits: int, half_bits: int, per_octave: int):
    """As `channels`, each channel's range coded in ``mid_bits + half_bits`` bits: its
    midpoint in signed steps of the head's largest |midpoint| / (2 ** (mid_bits - 1) - 1),
    its half-width widened to cover the midpoint's rounding and rounded up on a scale of
    ``per_octave`` steps an octave below the head's widest; those two largest as float16
    per block and head."""
    mid_codes, half_codes = 2 ** (mid_bits - 1) - 1, 2 ** half_bits - 1

    def encode(rows: torch.Tensor) -> torch.Tensor:
        lo, hi = rows.amin(0, keepdim=True), rows.amax(0, keepdim=True)
        mid, half = (lo + hi) / 2, (hi - lo) / 2
        mid_top = mid.abs().amax(-1, keepdim=True).half().float().clamp_min(1e-8)
        coded = ((mid / mid_top * mid_codes).round().clamp(-mid_codes, mid_codes)
                 * mid_top / mid_codes)
        need = half + (mid - coded).abs()
        half_top = need.amax(-1, keepdim=True).half().float().clamp_min(1e-8)
        steps = (-per_octave * torch.log2(need.clamp_min(1e-12) / half_top)).floor()
        half = half_top * torch.pow(2.0, -steps.clamp(0, half_codes) / per_octave)
        step = 2 * half / levels
        return ((rows - (coded - half)) / step).round().clamp(0, levels) * step + coded - half
    return encode


def midpoints_away(rows: torch.Tensor) -> torch.Tensor:
    """[n, nkv, hd]: each channel's midpoint over the n tokens (float16) taken away, the
    rest through the int4 format's rows: how much of the per-channel layout's gain is the
    channels' offsets."""
    mid = ((rows.amin(0, keepdim=True) + rows.amax(0, keepdim=True)) / 2).half().float()
    return format_rows(INT4)(rows - mid) + mid


def midpoint_rows(mid_bits: int | None, scale_steps: int | None):
    """[n, nkv, hd]: rotated as the int8 rows, each channel's midpoint over the n tokens
    taken away (float16, or coded in ``mid_bits`` signed steps of the head's largest
    |midpoint|), the rest as int8 rows (each row's scale float16, or rounded up to one of
    ``scale_steps`` steps an octave below the block's largest), the midpoints added back."""
    def encode(rows: torch.Tensor) -> torch.Tensor:
        x = INT8.rotate(rows.float())
        mid = (x.amin(0, keepdim=True) + x.amax(0, keepdim=True)) / 2
        if mid_bits is None:
            mid = mid.half().float()
        else:
            codes = 2 ** (mid_bits - 1) - 1
            top = mid.abs().amax(-1, keepdim=True).half().float().clamp_min(1e-8)
            mid = (mid / top * codes).round().clamp(-codes, codes) * top / codes
        rest = x - mid
        scale = rest.abs().amax(-1, keepdim=True) / 127
        if scale_steps is None:
            scale = scale.half().float()
        else:
            top = scale.amax(0, keepdim=True).half().float().clamp_min(1e-12)
            steps = (-scale_steps * torch.log2(scale.clamp_min(1e-12) / top)).floor()
            scale = top * torch.pow(2.0, -steps.clamp(0, 255) / scale_steps)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        rest = (rest / safe).round().clamp(-127, 127) * scale
        return INT8.rotate(rest + mid)
    return encode


@dataclass(frozen=True, slots=True)
class Layout:
    keys: Callable[[torch.Tensor], torch.Tensor]
    values: Callable[[torch.Tensor], torch.Tensor]
    key_bits: int
    value_row: Callable[[int], int]  # head size -> bytes
    key_params: Callable[[int, int], int]  # head size, block size -> bytes per block and head

    def bytes_per_token(self, hd: int, block: int) -> int:
        """One token's one KV head: a key row (values and its share of the block's key
        parameters) and a value row."""
        key_row = hd * self.key_bits // 8 + -(-self.key_params(hd, block) // block)
        return key_row + self.value_row(hd)


def _int4_row(hd: int) -> int:
    """A per-token int4 row alone: codes and a float16 scale per group (the pool's rows
    are longer by what the per-channel keys' parameters take, kv_key_channels.py)."""
    return hd // 2 + 2 * (hd // int4_group(hd))


_ROWS = {4: lambda hd, block: block * (_int4_row(hd) - hd // 2),
         8: lambda hd, block: block * (INT8.row_bytes(hd) - hd)}
_FP16_PARAMS = lambda hd, block: 4 * hd  # noqa: E731 (minimum and step per channel)


def _coded_params(bits: int) -> Callable[[int, int], int]:
    """``bits`` per channel, two float16 per block and head."""
    return lambda hd, block: -(-bits * hd // 8) + 4


LAYOUTS = {
    "int4-rows": Layout(format_rows(INT4), format_rows(INT4), 4, _int4_row, _ROWS[4]),
    "int4-channels": Layout(channels(15), format_rows(INT4), 4, _int4_row, _FP16_PARAMS),
    "int4-channels8": Layout(coded_channels(15, 8, 8, 16), format_rows(INT4), 4,
                             _int4_row, _coded_params(16)),
    "int4-channels11": Layout(coded_channels(15, 6, 5, 8), format_rows(INT4), 4,
                              _int4_row, _coded_params(11)),
    # Byte-aligned codes (an int8 midpoint, a 4-bit half-width at 4 steps an octave).
    "int4-channels12": Layout(coded_channels(15, 8, 4, 4), format_rows(INT4), 4,
                              _int4_row, _coded_params(12)),
    "int4-midpoints": Layout(midpoints_away, format_rows(INT4), 4, _int4_row,
                             lambda hd, block: _ROWS[4](hd, block) + 2 * hd),
    "int8-rows": Layout(format_rows(INT8), format_rows(INT8), 8, INT8.row_bytes, _ROWS[8]),
    "int8-channels8": Layout(coded_channels(255, 8, 8, 16), format_rows(INT8), 8,
                             INT8.row_bytes, _coded_params(16)),
    "int8-channels11": Layout(coded_channels(255, 6, 5, 8), format_rows(INT8), 8,
                              INT8.row_bytes, _coded_params(11)),
    "int8-channels12": Layout(coded_channels(255, 8, 4, 4), format_rows(INT8), 8,
                              INT8.row_bytes, _coded_params(12)),
    # Per-token int8 rows around each channel's midpoint over the block (one bias per
    # block in a reader's scores, where per-channel steps rescale the query per block).
    "int8-midpoints": Layout(midpoint_rows(None, None), format_rows(INT8), 8,
                             INT8.row_bytes, lambda hd, block: block * 2 + 2 * hd),
    "int8-midpoints6": Layout(midpoint_rows(6, 16), format_rows(INT8), 8,
                              INT8.row_bytes, lambda hd, block: block + 6 * hd // 8 + 4),
    "int8-midpoints7f": Layout(midpoint_rows(7, None), format_rows(INT8), 8,
                               INT8.row_bytes, lambda hd, block: block * 2 + 7 * hd // 8 + 2),
    "int8-midpoints6f": Layout(midpoint_rows(6, None), format_rows(INT8), 8,
                               INT8.row_bytes, lambda hd, block: block * 2 + 6 * hd // 8 + 2),
}


class LayoutBackend(TorchBackend):
    """The PyTorch backend over a float32 pool whose keys a layout encodes block by block
    and values its value format's rows."""

    def __init__(self, layout: Layout, from_exact: bool) -> None:
        super().__init__()
        self.layout = layout
        self.from_exact = from_exact
        self.exact: dict[int, torch.Tensor] = {}  # a key pool's data_ptr -> its exact rows

    def write_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:
        slots = slot_mapping.to(torch.int64)
        keep = slots >= 0
        key, value, slots = key[keep].float(), value[keep].float(), slots[keep]
        super().write_kv(key, self.layout.values(value), k_cache, v_cache, slots)
        block = k_cache.shape[1]
        exact = self._exact_of(k_cache)
        exact[slots // block, slots % block] = key
        for b in (slots // block).unique().tolist():
            n = int(slots[slots // block == b].max()) % block + 1
            # The pool holds the new rows exact (written above), the earlier ones decoded.
            source = exact[b, :n] if self.from_exact else k_cache[b, :n].float().clone()
            k_cache[b, :n] = self.layout.keys(source)

    def copy_blocks(self, kv_cache, src, dst) -> None:
        super().copy_blocks(kv_cache, src, dst)
        for layer in range(kv_cache.shape[0]):
            exact = self._exact_of(kv_cache[layer, 0])
            exact[dst.long()] = exact[src.long()]

    def swap_blocks(self, src_cache, dst_cache, src_ids, dst_ids) -> None:
        super().swap_blocks(src_cache, dst_cache, src_ids, dst_ids)
        for layer in range(dst_cache.shape[0]):
            exact = self.exact.get(dst_cache[layer, 0].data_ptr())
            if exact is not None:
                exact[dst_ids.long()] = dst_cache[layer, 0][dst_ids.long()].float()

    def _exact_of(self, k_cache: torch.Tensor) -> torch.Tensor:
        exact = self.exact.get(k_cache.data_ptr())
        if exact is None:  # rows never written read as the pool holds them
            exact = self.exact[k_cache.data_ptr()] = k_cache.float().clone()
        return exact


def _first_difference(a: list[int], b: list[int]) -> int:
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", default="int4-rows,int4-channels,int4-channels8")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--append", choices=("exact", "decoded"), default="exact")
    parser.add_argument("--chunk", type=int, default=kv_quality.CHUNK,
                        help="tokens per forward of the teacher-forced text (1: every "
                             "block filled a token at a time, as decoding fills it)")
    parser.add_argument("--no-greedy", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--weights", default="float32",
                        help="the engine's weights setting (folio bench kv's: stored)")
    args = parser.parse_args()
    layouts = args.layouts.split(",")
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        parser.error(f"--layouts: unknown {unknown}; known {sorted(LAYOUTS)}")
    torch.set_num_threads(args.threads)
    kv_quality.CHUNK = args.chunk  # read by teacher_forced_logprobs

    def engine(dtype: str) -> LLM:
        return LLM("starter", folio_config(args.threads, args.weights, kv_cache_dtype=dtype,
                                           attention_backend="torch",
                                           block_size=args.block_size))

    greedy = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    context = leading_paragraphs(1100)
    chats = [[{"role": "user", "content": f"{context}\n\n{q}"}] for q in QUESTIONS[:5]]
    reference = engine("float16")
    hd = reference.engine.runner.shape.head_size
    ids = reference.tokenizer.encode(TEXT)[:2048]
    ref_logprobs = kv_quality.teacher_forced_logprobs(reference, ids)
    ref_replies = [] if args.no_greedy else [
        list(reference.chat(c, greedy).outputs[0].token_ids) for c in chats]
    del reference
    print(f"starter, block size {args.block_size}, text read {args.chunk} tokens at a time, "
          f"keys re-encoded from {args.append} rows; bytes per token against float16's, "
          f"K and V rows of their own lengths / of one length (the pool's today)")
    for name in layouts:
        layout = LAYOUTS[name]
        llm = engine("float32")
        llm.engine.runner.backend = LayoutBackend(layout, args.append == "exact")
        kl = kv_quality.mean_kl(ref_logprobs, kv_quality.teacher_forced_logprobs(llm, ids))
        apart = layout.bytes_per_token(hd, args.block_size)
        one = 2 * max(apart - layout.value_row(hd), layout.value_row(hd))
        line = (f"{name:15} bytes {apart / (4 * hd):.3f} / {one / (4 * hd):.3f}  "
                f"mean KL {kl:.5f}")
        if ref_replies:
            replies = [list(llm.chat(c, greedy).outputs[0].token_ids) for c in chats]
            same = sum(a == b for a, b in zip(replies, ref_replies, strict=True))
            line += f"  greedy replies equal {same} of {len(chats)}"
            apart = [f"{i + 1}@{_first_difference(a, b) + 1}"
                     for i, (a, b) in enumerate(zip(replies, ref_replies, strict=True)) if a != b]
            if apart:
                line += f" (reply@token where the others part: {', '.join(apart)})"
        print(line, flush=True)
        del llm


if __name__ == "__main__":
    main()
