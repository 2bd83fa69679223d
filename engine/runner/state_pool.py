"""The linear-attention state pool: per slot a conv window and a recurrent state for each
linear layer, beside the KV pool, and how many slots it has.

Slots are the linear group's "blocks" (engine/core/linear_state_manager.py): a sequence's
running state, or a snapshot of one at a block boundary. Slot ``num_slots`` (the last
row) is the group's null block, never written. Recurrent states are float32 whatever
the activations (they sum the whole context); conv windows are in the activation dtype.

Sizing (`state_slots`): ``LIVE_STATE_SLOTS`` running states at most (fewer when
``max_num_seqs`` is lower; a request waits for a slot as it waits for blocks), and for
snapshots half the KV pool's bytes again, at least two per live slot: a chat turn needs
only its newest snapshot, the rest serve branches and other chats and are evicted
oldest first.
"""

from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.layers.gated_deltanet import DeltaNetShape

LIVE_STATE_SLOTS = 16
MAX_STATE_SLOTS = 4096


def state_slots(config: EngineConfig, slot_bytes: int, kv_pool_bytes: int) -> tuple[int, int]:
    """(slots in the pool, slots kept for running states)."""
    live = max(1, min(config.max_num_seqs, LIVE_STATE_SLOTS))
    snapshots = max(2 * live, kv_pool_bytes // 2 // max(1, slot_bytes))
    return min(MAX_STATE_SLOTS, live + snapshots), live


class StatePool:
    def __init__(self, shape: DeltaNetShape, num_layers: int, num_slots: int,
                 num_host_slots: int, dtype: torch.dtype, device: torch.device) -> None:
        self.shape = shape
        self.conv, self.rec = self._allocate(num_layers, num_slots + 1, dtype, device)
        self.host: tuple[torch.Tensor, torch.Tensor] | None = None
        if num_host_slots:
            self.host = self._allocate(num_layers, num_host_slots, dtype,
                                       torch.device("cpu"), device.type == "cuda")

    def _allocate(self, num_layers: int, num_slots: int, dtype: torch.dtype,
                  device: torch.device, pin_memory: bool = False):
        s = self.shape
        conv = torch.zeros(num_layers, num_slots, s.conv_dim, s.conv_width - 1, dtype=dtype,
                           device=device, pin_memory=pin_memory)
        rec = torch.zeros(num_layers, num_slots, s.num_v_heads, s.head_k_dim, s.head_v_dim,
                          dtype=torch.float32, device=device, pin_memory=pin_memory)
        return conv, rec

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.conv, self.rec))

    @property
    def slot_bytes(self) -> int:
        """One slot across the layers (a running state, or a snapshot)."""
        return self.nbytes // self.conv.shape[1]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Linear layer i's conv and recurrent states, [slots, ...] each."""
        return self.conv[i], self.rec[i]

    def move(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]],
             copies: list[tuple[int, int]]) -> None:
        """A step's moves of slots, in the order the KV pool applies its own: swap-outs
        (device, host), swap-ins (host, device), then copies (src, dst: forks, prefix
        hits resuming from a snapshot)."""
        device = (self.conv, self.rec)
        for source, target, pairs in ((device, self.host, swap_out),
                                      (self.host, device, swap_in),
                                      (device, device, copies)):
            if not pairs:
                continue
            assert source is not None and target is not None, "swaps need host slots"
            (src_conv, src_rec), (dst_conv, dst_rec) = source, target
            src = torch.tensor([p[0] for p in pairs], device=src_conv.device)
            dst = torch.tensor([p[1] for p in pairs], device=dst_conv.device)
            dst_conv[:, dst] = src_conv[:, src].to(dst_conv.device)
            dst_rec[:, dst] = src_rec[:, src].to(dst_rec.device)
