"""The plain data a Gated DeltaNet layer runs on: its shape (`DeltaNetShape`) and a step's
sequences as its state slots see them (`StateMetadata`). engine/layers/gated_deltanet.py
re-exports both."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StateMetadata:
    """A step's sequences as the linear layers see them, in the step's row order."""

    query_start_loc: list[int]  # len = sequences + 1: each sequence's rows
    slots: list[int]  # each sequence's state slot
    resumes: list[bool]  # whether its chunk continues the slot's state (else: zeros)
    # Per sequence, (tokens into its chunk, slot): copy the state there once that many
    # of its tokens are in (a snapshot at a block boundary).
    snapshots: list[list[tuple[int, int]]] | None = None
    # What the token mixer derives from the lists above (device tensors, chunk tables),
    # built by the step's first linear layer and reused by the others.
    derived: dict = field(default_factory=dict, repr=False, compare=False)


@dataclass(slots=True, frozen=True)
class DeltaNetShape:
    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_width: int
    eps: float
    # Value heads in llama.cpp's tiled order (a GGUF file): see delta_rule.prepare_qk.
    v_heads_tiled: bool = False

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """The channels the conv mixes: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim

    def state_bytes(self, conv_itemsize: int) -> int:
        """One sequence's state in one layer: the conv window and the float32 state."""
        conv = self.conv_dim * (self.conv_width - 1) * conv_itemsize
        return conv + self.num_v_heads * self.head_k_dim * self.head_v_dim * 4
