"""Gated DeltaNet's token mixing over the state pool (the causal conv, then the gated delta
rule), one implementation per device, picked once when the layer is built
(`token_mixer_for`): the Triton kernels (kernels/triton/delta_rule_*.py) on CUDA where
Triton is installed, PyTorch (engine/layers/delta_rule.py) everywhere else.

Both take a step's rows as the layer's projection leaves them and leave the same states
in the pool: a sequence of one row that continues its slot is a decode row, taken by the
recurrent step with every other decode row; the rest are prompt chunks. A chunk that
reaches snapshots copies its state at each of them into the snapshot's slot.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.layers import delta_rule
from engine.layers.deltanet_data import DeltaNetShape, StateMetadata


@dataclass(slots=True)
class MixerInputs:
    """One step of one layer: mixed [T, conv_dim] (q, k, v before the conv), g and beta
    float32 [T, Hv], the layer's conv weight [conv_dim, K] and pool views (conv
    [slots, conv_dim, K - 1], recurrent float32 [slots, Hv, Dk, Dv], updated in place)."""

    mixed: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    conv_weight: torch.Tensor
    conv_states: torch.Tensor
    rec_states: torch.Tensor
    meta: StateMetadata


class TokenMixer(Protocol):
    name: str

    def __call__(self, shape: DeltaNetShape, x: MixerInputs) -> torch.Tensor:
        """The core output float32 [T, Hv, Dv], before the gated norm."""
        ...


def decode_rows(meta: StateMetadata) -> list[int]:
    """The sequences of the step that take the recurrent step: one row, resuming."""
    starts = meta.query_start_loc
    return [i for i in range(len(meta.slots))
            if meta.resumes[i] and starts[i + 1] - starts[i] == 1]


def split_heads(shape: DeltaNetShape, conv_out: torch.Tensor):
    """The conv's output [..., C] to q, k [..., Hk, Dk] and v [..., Hv, Dv] (views)."""
    s = shape
    q, k, v = conv_out.split((s.key_dim, s.key_dim, s.value_dim), dim=-1)
    return (q.unflatten(-1, (s.num_k_heads, s.head_k_dim)),
            k.unflatten(-1, (s.num_k_heads, s.head_k_dim)),
            v.unflatten(-1, (s.num_v_heads, s.head_v_dim)))


def derived(meta: StateMetadata, key: str, build):
    """``build()``, once per step: the step's layers share one StateMetadata."""
    if key not in meta.derived:
        meta.derived[key] = build()
    return meta.derived[key]


def _decode(shape: DeltaNetShape, x: MixerInputs, core: torch.Tensor, decodes: list[int],
            step) -> None:
    """The decode rows through ``step(q, k, v, g, beta, slots)`` (the recurrent state
    update, in place), the conv step before it, and their snapshots after."""
    meta, device = x.meta, x.mixed.device
    rows, slots = derived(meta, "decode_rows", lambda: (
        torch.tensor([meta.query_start_loc[i] for i in decodes], device=device),
        torch.tensor([meta.slots[i] for i in decodes], device=device)))
    snapshots = meta.snapshots or [[]] * len(meta.slots)

    def keep(after: bool) -> None:
        for i in decodes:
            for offset, snap in snapshots[i]:
                if bool(offset) == after:
                    x.conv_states[snap] = x.conv_states[meta.slots[i]]
                    x.rec_states[snap] = x.rec_states[meta.slots[i]]

    keep(after=False)  # offset 0: the state the row starts from
    conv_out, x.conv_states[slots] = delta_rule.conv_step(x.mixed[rows], x.conv_weight,
                                                          x.conv_states[slots])
    core[rows] = step(*split_heads(shape, conv_out), x.g[rows], x.beta[rows], slots)
    keep(after=True)


class TorchMixer:
    """PyTorch: decode rows batched, each prompt chunk on its own, split at its snapshots
    (splitting a prompt anywhere leaves the same states)."""

    name = "torch"

    def __call__(self, shape: DeltaNetShape, x: MixerInputs) -> torch.Tensor:
        meta = x.meta
        core = torch.empty(x.mixed.shape[0], shape.num_v_heads, shape.head_v_dim,
                           dtype=torch.float32, device=x.mixed.device)
        decodes = decode_rows(meta)
        if decodes:
            def step(q, k, v, g, beta, slots):
                q, k = delta_rule.prepare_qk(q, k, shape.num_v_heads, shape.v_heads_tiled)
                out, x.rec_states[slots] = delta_rule.recurrent_step(q, k, v, g, beta,
                                                                     x.rec_states[slots])
                return out
            _decode(shape, x, core, decodes, step)
        starts, snapshots = meta.query_start_loc, meta.snapshots or [[] for _ in meta.slots]
        for i in sorted(set(range(len(meta.slots))) - set(decodes)):
            slot, r0, r1 = meta.slots[i], starts[i], starts[i + 1]
            conv, rec = ((x.conv_states[slot], x.rec_states[slot]) if meta.resumes[i]
                         else (None, None))
            start = r0
            for end, snap in [*((r0 + offset, snap) for offset, snap in snapshots[i]),
                              (r1, slot)]:
                if end > start:
                    core[start:end], conv, rec = _piece(shape, x, start, end, conv, rec)
                    start = end
                if conv is not None:
                    x.conv_states[snap], x.rec_states[snap] = conv, rec
        return core


def _piece(shape: DeltaNetShape, x: MixerInputs, start: int, end: int,
           conv: torch.Tensor | None, rec: torch.Tensor | None):
    """Rows [start, end) of one sequence from its conv and recurrent states (None: a
    fresh sequence) -> (out [T, Hv, Dv], the states after them). A single row that
    resumes takes decode's recurrent step, as a verify step's rows (split at each of its
    tokens) do: the same arithmetic as plain decode, without a padded chunk per token."""
    if end - start == 1 and conv is not None:
        conv_out, conv = delta_rule.conv_step(x.mixed[start:end], x.conv_weight, conv[None])
        q, k, v = split_heads(shape, conv_out)
        q, k = delta_rule.prepare_qk(q, k, shape.num_v_heads, shape.v_heads_tiled)
        out, rec = delta_rule.recurrent_step(q, k, v, x.g[start:end], x.beta[start:end],
                                             rec[None])
        return out, conv[0], rec[0]
    conv_out, conv = delta_rule.conv_prefill(x.mixed[start:end], x.conv_weight, conv)
    q, k, v = split_heads(shape, conv_out)
    q, k = delta_rule.prepare_qk(q, k, shape.num_v_heads, shape.v_heads_tiled)
    out, rec = delta_rule.chunked_prefill(q, k, v, x.g[start:end], x.beta[start:end], rec)
    return out, conv, rec


class TritonMixer:
    """Triton: the decode rows in one recurrent-step launch, every prompt chunk of the
    step in one varlen chunked prefill (two launches), each reading and writing its
    state in the pool. The conv stays in PyTorch (a depthwise conv1d per chunk, run whole:
    a snapshot's conv window is a slice of the chunk's input), q and k are normalized
    and mapped to value heads inside the kernels."""

    name = "triton"

    def __init__(self) -> None:
        # Imported here: the PyTorch path must not need Triton.
        from kernels.triton.delta_rule_chunk import chunk_layout, chunked_prefill
        from kernels.triton.delta_rule_decode import recurrent_step

        self._layout, self._prefill, self._step = chunk_layout, chunked_prefill, recurrent_step

    def __call__(self, shape: DeltaNetShape, x: MixerInputs) -> torch.Tensor:
        meta, tiled = x.meta, shape.v_heads_tiled
        core = torch.empty(x.mixed.shape[0], shape.num_v_heads, shape.head_v_dim,
                           dtype=torch.float32, device=x.mixed.device)
        decodes = decode_rows(meta)
        if decodes:
            _decode(shape, x, core, decodes,
                    lambda q, k, v, g, beta, slots: self._step(q, k, v, g, beta,
                                                               x.rec_states, slots, tiled))
        prompts = sorted(set(range(len(meta.slots))) - set(decodes))
        if not prompts:
            return core
        starts, snapshots = meta.query_start_loc, meta.snapshots or [[] for _ in meta.slots]
        conv_out = torch.empty_like(x.mixed)
        width = shape.conv_width
        for i in prompts:
            slot, r0, r1 = meta.slots[i], starts[i], starts[i + 1]
            window = delta_rule.conv_window(
                x.mixed[r0:r1], x.conv_states[slot] if meta.resumes[i] else None, width)
            conv_out[r0:r1] = delta_rule.conv_of_window(window, x.conv_weight)
            for offset, snap in snapshots[i]:
                x.conv_states[snap] = window[:, offset:offset + width - 1]
            x.conv_states[slot] = window[:, -(width - 1):]
        layout = derived(meta, "chunk_layout", lambda: self._layout(
            [(starts[i], starts[i + 1]) for i in prompts], [meta.slots[i] for i in prompts],
            [meta.resumes[i] for i in prompts], [snapshots[i] for i in prompts],
            x.mixed.device))
        q, k, v = split_heads(shape, conv_out)
        self._prefill(q, k, v, x.g, x.beta, x.rec_states, layout, core, tiled)
        return core


def token_mixer_for(device: torch.device | str) -> TokenMixer:
    """The Triton kernels on CUDA where Triton is installed, PyTorch elsewhere."""
    if torch.device(device).type == "cuda" and importlib.util.find_spec("triton"):
        return TritonMixer()
    return TorchMixer()
