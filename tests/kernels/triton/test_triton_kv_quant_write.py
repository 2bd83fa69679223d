"""The Triton KV write into int8, fp8 and int4 pools against `KVFormat.encode` (an int8 or
int4 pool's values only: its key rows are a block's, encoded by the key stage, and the
write leaves them alone), the backend's key writes through the stage against
`KVFormat.encode_keys`, and the block moves (copy-on-write, swap) over quantized pools
moving rows byte for byte. Interpreted on CPU, compiled on CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from kernels import allocate_kv_cache
from kernels.key_stage import KeyStage
from kernels.kv_format import format_named, int4_group
from kernels.kv_key_centers import MIN_BLOCK_SIZE as INT8_MIN_BLOCK_SIZE
from kernels.kv_key_channels import MIN_BLOCK_SIZE, param_bytes
from kernels.triton.backend import TritonBackend
from kernels.triton.cache import copy_blocks, swap_blocks, write_kv
from kernels.triton.kv_quant import (
    _e4m3_round,
    _round_half_even,
    int4_key_spare,
    int4_row_len,
    int8_row_len,
    int8_spare,
)
from tests.kernels.paged_cases import DEVICE, DTYPES
from tests.kernels.triton.kv_quant_cases import QUANTIZED, block_size_for

BLOCK_SIZE = 16
# The interpreter computes in numpy, which warns where a GPU silently makes inf or NaN:
# lanes a kernel masks afterwards must not overflow first.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


def _pool(name: str, num_layers: int, num_blocks: int, nkv: int, head_size: int,
          seed: int) -> torch.Tensor:
    """A pool of random bytes (a quantized pool full of older tokens): a write that
    strays shows. Blocks of BLOCK_SIZE tokens, of 64 for int8 and 32 for int4."""
    fmt = format_named(name)
    pool = allocate_kv_cache(num_layers, num_blocks, block_size_for(name, BLOCK_SIZE), nkv,
                             head_size, fmt.storage, DEVICE, head_major=False)
    gen = torch.Generator().manual_seed(seed)
    pool.view(torch.uint8).copy_(torch.randint(0, 256, pool.shape, generator=gen,
                                               dtype=torch.uint8))
    if name == "fp8":  # no NaN codes: the test compares bytes, not values
        pool.view(torch.uint8).bitwise_and_(0x77)
    return pool


def _assert_encoded(stored: torch.Tensor, rows: torch.Tensor, name: str) -> None:
    """stored rows equal encode(rows) byte for byte, but for rare codes off by one where
    the device rounds a tie otherwise."""
    fmt = format_named(name)
    got, want = stored.contiguous().view(torch.uint8), fmt.encode(rows).view(torch.uint8)
    assert got.shape == want.shape
    differ = got != want
    if DEVICE.type == "cpu":  # the interpreter computes as torch does
        assert not differ.any()
        return
    assert differ.float().mean() < 1e-3
    step = (fmt.decode(want.view(fmt.storage)) - fmt.decode(got.view(fmt.storage))).abs()
    assert step.max() <= fmt.decode(want.view(fmt.storage)).abs().max() / 7 + 1e-6


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("nkv,head_size", [(3, 64), (2, 80), (1, 128), (2, 256)])
def test_write_kv_encodes_each_token_at_its_slot(name, nkv, head_size, dtype):
    pool = _pool(name, 1, 6, nkv, head_size, seed=1)
    before = pool.clone()
    gen = torch.Generator().manual_seed(2)
    # As the attention layer hands them over: views of a fused projection, with an
    # outlier, a row of zeros (scale 0) and values past what fp8 holds unscaled.
    fused = torch.randn((6, 2 * nkv, head_size), generator=gen) * 3
    fused[0, 0, 5] = 60.0
    fused[3, nkv] = 0.0
    fused[2] *= 400
    fused = fused.to(DEVICE, dtype)
    key, value = fused[:, :nkv], fused[:, nkv:]
    bs = pool.shape[3]
    slots = [3 * bs + 1, -1, 0, 6 * bs - 1, bs, 2 * bs - 1]
    # The write itself: the backend then hands an int8 or int4 pool's keys to its stage
    # (below).
    write_kv(key, value, pool[0, 0], pool[0, 1],
             torch.tensor(slots, dtype=torch.int64, device=DEVICE))
    written = [(t, s) for t, s in enumerate(slots) if s >= 0]
    blocks = [s // bs for _, s in written]
    offsets = [s % bs for _, s in written]
    tokens = [t for t, _ in written]
    if format_named(name).keys_by_block:
        # Value rows as encode writes them (zeros after the scales, up to the row's
        # length: the spare bytes a key row's block uses); the key pool as it was, bytes
        # and all.
        assert torch.equal(pool[0, 0].view(torch.uint8), before[0, 0].view(torch.uint8))
    else:
        _assert_encoded(pool[0, 0, blocks, offsets], key[tokens], name)
    _assert_encoded(pool[0, 1, blocks, offsets], value[tokens], name)
    # Every other slot (the skipped token's included) keeps its bytes.
    untouched = torch.ones(6, bs, dtype=torch.bool)
    untouched[blocks, offsets] = False
    assert torch.equal(pool[:, :, untouched].view(torch.uint8),
                       before[:, :, untouched].view(torch.uint8))


@pytest.mark.parametrize("name,head_size", [("int4", 64), ("int4", 80), ("int4", 60),
                                            ("int8", 64), ("int8", 100)])
def test_the_backend_writes_block_keys_through_the_stage(name, head_size):
    """A prefill chunk, then a token at a time across a block boundary (a block of the
    fewest tokens the format takes): the key blocks equal encode_keys of the rows so far
    (encoded by the Triton kernels, or PyTorch's for int4 where the head size is no
    multiple of 8), the value rows encode's."""
    fmt = format_named(name)
    bs = fmt.min_block_size
    pool = allocate_kv_cache(1, 3, bs, 2, head_size, fmt.storage, DEVICE, head_major=False)
    pool.view(torch.uint8).fill_(0x5A)  # older bytes: a row left unwritten shows
    backend = TritonBackend()
    backend.key_stages.attach(KeyStage(pool, slots=1))
    gen = torch.Generator().manual_seed(5)
    n = bs + 8
    key, value = torch.randn(2, n, 2, head_size, generator=gen).to(DEVICE).unbind(0)
    key = key * 2 + torch.randn(2, head_size, generator=gen).to(DEVICE) * 3  # offsets
    for start, end in ((0, bs - 2), *((t, t + 1) for t in range(bs - 2, n))):
        slots = torch.arange(bs + start, bs + end, device=DEVICE)
        backend.write_kv(key[start:end], value[start:end], pool[0, 0], pool[0, 1], slots)
    rows = torch.zeros(2, bs, 2, head_size, device=DEVICE)
    rows.view(2 * bs, 2, head_size)[:n] = key
    want = fmt.encode_keys(rows, torch.tensor([bs, 8], device=DEVICE))
    assert torch.equal(pool[0, 0, 1:3].view(torch.uint8), want.view(torch.uint8))
    _assert_encoded(pool[0, 1, 1:3].flatten(0, 1)[:n], value, name)


def test_write_kv_refuses_rows_of_another_head_size():
    pool = _pool("int4", 1, 2, 1, 64, seed=3)
    key = torch.ones(2, 1, 128, device=DEVICE)
    with pytest.raises(ValueError, match="int4 rows"):
        write_kv(key, key, pool[0, 0], pool[0, 1], torch.zeros(2, dtype=torch.int64,
                                                               device=DEVICE))


@pytest.mark.parametrize("name", ["fp8", "int4"])
def test_copy_blocks_moves_quantized_rows_as_bytes(name):
    pool = _pool(name, 2, 8, 2, 64, seed=4)
    before = pool.clone()
    src = torch.tensor([1, 5, 1], dtype=torch.int64, device=DEVICE)
    dst = torch.tensor([6, 0, 7], dtype=torch.int64, device=DEVICE)
    TritonBackend().copy_blocks(pool, src, dst)
    expected = before.view(torch.uint8).clone()
    expected[:, :, [6, 0, 7]] = expected[:, :, [1, 5, 1]]
    assert torch.equal(pool.view(torch.uint8), expected)
    empty = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    copy_blocks(pool, empty, empty)
    assert torch.equal(pool.view(torch.uint8), expected)


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_swap_blocks_moves_quantized_rows_as_bytes(name):
    device_pool = _pool(name, 2, 9, 2, 64, seed=5)
    host = torch.device("cpu")
    host_pool = _pool(name, 2, 5, 2, 64, seed=6).to(host)
    device_before = device_pool.view(torch.uint8).clone()
    TritonBackend().swap_blocks(device_pool, host_pool, torch.tensor([8, 2]),
                                torch.tensor([0, 3]))
    TritonBackend().swap_blocks(host_pool, device_pool, torch.tensor([3]), torch.tensor([5]))
    assert torch.equal(host_pool.view(torch.uint8)[:, :, [0, 3]],
                       device_before[:, :, [8, 2]].to(host))
    expected = device_before.clone()
    expected[:, :, 5] = device_before[:, :, 2]
    assert torch.equal(device_pool.view(torch.uint8), expected)
    # The other 8-bit format's pool of the same shape (int8 rows are longer than fp8's).
    other = host_pool.view(torch.float8_e4m3fn if name == "int8" else torch.int8)
    with pytest.raises(ValueError, match="pool dtypes differ"):
        swap_blocks(device_pool, other, torch.tensor([0]), torch.tensor([1]))


def test_int4_group_and_row_sizes_the_kernel_assumes():
    # The kernel packs element pairs within a group: groups must be even.
    for head_size in (64, 80, 96, 128, 256):
        assert int4_group(head_size) % 2 == 0
        assert head_size % int4_group(head_size) == 0
    # The kernels size rows at compile time (int4_row_len, int4_key_spare); a key block's
    # parameters, and the byte past them that a field's second byte may be, fit the spare
    # bytes of MIN_BLOCK_SIZE rows; the value row's padding is narrower than its codes.
    fmt = format_named("int4")
    for head_size in range(2, 514, 2):
        row = fmt.row_len(head_size)
        assert int4_row_len(head_size) == row
        assert int4_key_spare(head_size) == row - head_size // 2
        assert MIN_BLOCK_SIZE * int4_key_spare(head_size) >= param_bytes(head_size) + 1
        value_row = head_size // 2 + 2 * (head_size // int4_group(head_size))
        assert row - value_row < max(head_size // 2, 1)  # HALF_PAD lanes zero it


def test_int8_row_sizes_the_kernels_assume():
    # The kernels size int8 rows at compile time (int8_row_len, int8_spare); a key block's
    # center codes fit the spare bytes of its rows (of the fewest it has), M's 16 bits the
    # first rows' scales, and the value write zeroes the spare bytes with HEAD_PAD lanes.
    fmt = format_named("int8")
    assert INT8_MIN_BLOCK_SIZE == fmt.min_block_size == 64
    for head_size in range(1, 513):
        row = fmt.row_len(head_size)
        assert int8_row_len(head_size) == row
        assert int8_spare(head_size) == row - head_size - 2 >= 1
        assert INT8_MIN_BLOCK_SIZE * int8_spare(head_size) >= head_size
        assert int8_spare(head_size) <= triton.next_power_of_2(head_size)
        assert fmt.head_size(row) == head_size


@triton.jit
def _rounding_probe(x_ptr, half_ptr, e4m3_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    tl.store(half_ptr + offs, _round_half_even(x))
    tl.store(e4m3_ptr + offs, _e4m3_round(tl.minimum(tl.maximum(x, -448.0), 448.0)))


def test_rounding_helpers_match_torch():
    gen = torch.Generator().manual_seed(8)
    ties = torch.arange(-8, 8, dtype=torch.float32) + 0.5
    x = torch.cat([ties, torch.randn(480, generator=gen) * 60,
                   torch.tensor([0.0, -0.0, 1e-4, 2.0**-9 * 1.5, 31.6, 447.9, 500.0, -15.95]),
                   torch.randn(8, generator=gen) * 1e-2]).to(DEVICE)
    half, e4m3 = torch.empty_like(x), torch.empty_like(x)
    _rounding_probe[(1,)](x, half, e4m3, N=x.numel())
    assert torch.equal(half, torch.round(x))
    want = x.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    assert torch.equal(e4m3, want)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA every test runs compiled")
def test_quantized_kernels_compile_for_hopper():
    # As tests/kernels/triton/test_triton_decode.py's compile check, for the quantized
    # variants: the interpreter lets through what a GPU build rejects.
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    code = ("from tests.kernels.triton.kv_quant_cases import compile_quantized_for_hopper "
            "as c; print(len(c()))")
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "12"
