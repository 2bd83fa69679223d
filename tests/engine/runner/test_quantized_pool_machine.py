"""The KV state machine (tests/engine/core/test_kv_state_machine.py) over real quantized
pools: every K/V write, copy-on-write copy, swap out and in, and disk save and read the
machine plays on its lists of tokens is also done on an int8 (or fp8, int4) device pool
and host pool of real rows, through the PyTorch reference's block moves, and after every
step each position a sequence still reads (or a swapped one holds on the host) must hold
its own token's encoded rows, byte for byte."""

from __future__ import annotations

import functools

import torch
from hypothesis import HealthCheck, settings

from kernels import allocate_kv_cache
from kernels.kv_format import format_named
from kernels.reference.backend import TorchBackend
from tests.engine.core.test_kv_state_machine import BLOCK_SIZE, KVMachine
from tests.engine.core.test_kv_state_machine import invariant as _invariant

HEAD_SIZE = 64


@functools.cache
def rows_of(token: int, fmt_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A token's K and V rows [1, row] as `fmt_name` encodes them."""
    fmt = format_named(fmt_name)
    gen = torch.Generator().manual_seed(token)
    values = torch.randn(2, 1, HEAD_SIZE, generator=gen) * (1 + token % 7)
    return fmt.encode(values[0]), fmt.encode(values[1])


class PoolMachine(KVMachine):
    FORMAT = "int8"

    def __init__(self) -> None:
        super().__init__()
        self.fmt = format_named(self.FORMAT)
        self.backend = TorchBackend()
        self.pool_tensors = [self._pool(n + 1) for n in self.num_blocks]
        self.host_tensors = [self._pool(max(1, self.num_host)) for _ in self.pools]
        self.files: dict[bytes, torch.Tensor] = {}  # the disk's real blocks, by hash
        kv = self.kv
        take_cow, swap_out, swap_in, take_saves = (kv.take_cow_pairs, kv.swap_out,
                                                   kv.swap_in, kv.take_saves)
        pending: list = []

        def saves_now():
            """The saves due, their blocks' rows kept before anything overwrites them."""
            saves = take_saves()
            for g, group in enumerate(saves):
                for block_id, block_hash, _ in group:
                    self.files[(g, block_hash)] = self.pool_tensors[g][:, :, block_id].clone()
            return saves

        def merged_saves():
            new = saves_now()
            if pending:
                new = [old + n for old, n in zip(pending.pop(), new, strict=True)]
            return new

        def cow_pairs():
            pairs = take_cow()
            for g, group in enumerate(pairs):
                self._move(g, "copy", group)
            return pairs

        def out(seqs):
            moves = swap_out(seqs)
            for g, pairs in enumerate(moves):
                self._move(g, "out", pairs)
            return moves

        def into(seqs):
            moves = swap_in(seqs)
            pending.append(saves_now())  # as the runner: saves before the moves
            for g, pairs in enumerate(moves):
                self._move(g, "in", pairs)
            return moves

        kv.take_cow_pairs, kv.swap_out, kv.swap_in, kv.take_saves = (cow_pairs, out, into,
                                                                     merged_saves)

    def _pool(self, num_blocks: int) -> torch.Tensor:
        """[1 layer, K/V, num_blocks, BLOCK_SIZE, 1 head, row] in the format's dtype."""
        return allocate_kv_cache(1, num_blocks, BLOCK_SIZE, 1, HEAD_SIZE, self.fmt.storage,
                                 "cpu", head_major=True)

    def _move(self, g: int, kind: str, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        src = torch.tensor([a for a, _ in pairs])
        dst = torch.tensor([b for _, b in pairs])
        device, host = self.pool_tensors[g], self.host_tensors[g]
        if kind == "copy":
            self.backend.copy_blocks(device, src, dst)
        elif kind == "out":
            self.backend.swap_blocks(device, host, src, dst)
        else:
            self.backend.swap_blocks(host, device, src, dst)

    def _step(self, seq) -> bool:
        start = seq.num_computed_tokens
        if not super()._step(seq):
            return False
        for g in self.groups:
            table = self.kv.block_tables(seq)[g]
            positions = range(start, seq.num_computed_tokens)
            slots = torch.tensor([table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
                                  for p in positions], dtype=torch.int64)
            keys = torch.stack([rows_of(seq.token_ids[p], self.FORMAT)[0] for p in positions])
            values = torch.stack([rows_of(seq.token_ids[p], self.FORMAT)[1] for p in positions])
            cache = self.pool_tensors[g][0]
            # The rows as write_kv stores them: encoded already, so written as bytes.
            flat = [c.view(torch.uint8).flatten(0, 1) for c in (cache[0], cache[1])]
            flat[0][slots] = keys.view(torch.uint8)
            flat[1][slots] = values.view(torch.uint8)
        return True

    def _finish_reads(self, reads) -> None:
        for read in reads:
            # What DictTier.load will answer (asked here without its side effects).
            disk = self.disks[read.group]
            tokens, _ = disk.files[read.block_hash]
            ok = read.block_hash not in disk.damaged and tokens == read.token_ids
            if ok and self.kv.loads.get(read.ticket) is not None:
                block = self.files[(read.group, read.block_hash)]
                self.pool_tensors[read.group][:, :, read.block_id].copy_(block)
        super()._finish_reads(reads)

    def _check_rows(self, pool: torch.Tensor, block_id: int, pos: int, token: int) -> None:
        key, value = rows_of(token, self.FORMAT)
        for kv, expected in ((0, key), (1, value)):
            row = pool[0, kv, block_id, pos % BLOCK_SIZE, 0]  # [row]
            assert torch.equal(row.view(torch.uint8), expected.view(torch.uint8)[0]), (
                block_id, pos, token)

    @_invariant()
    def real_rows_hold_their_tokens(self) -> None:
        for seq in self.live:
            for g, m in enumerate(self.kv.managers):
                table = self.kv.block_tables(seq)[g]
                for pos in range(m.first_kept(seq.num_computed_tokens) * BLOCK_SIZE,
                                 seq.num_computed_tokens):
                    self._check_rows(self.pool_tensors[g], table[pos // BLOCK_SIZE], pos,
                                     seq.token_ids[pos])
        for seq in self.swapped:
            for g, m in enumerate(self.kv.managers):
                table = m.host_tables[seq.seq_id]
                for pos in range(m.first_kept(seq.num_computed_tokens) * BLOCK_SIZE,
                                 seq.num_computed_tokens):
                    self._check_rows(self.host_tensors[g], table[pos // BLOCK_SIZE], pos,
                                     seq.token_ids[pos])


def _machine(fmt: str, kind: str, examples: int):
    name = f"PoolMachine_{fmt}_{kind.replace('+', '_')}"
    machine = type(name, (PoolMachine,), {"FORMAT": fmt, "KIND": kind, "TIERS": True})
    machine.TestCase.settings = settings(
        max_examples=examples, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
    return machine.TestCase


TestInt8PoolsOverTheTiers = _machine("int8", "global", 100)
TestInt8PoolsTwoKinds = _machine("int8", "global+sliding", 60)
TestFp8PoolsOverTheTiers = _machine("fp8", "global+sliding", 40)
TestInt4PoolsOverTheTiers = _machine("int4", "global", 40)
