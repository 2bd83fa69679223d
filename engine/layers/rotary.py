"""Rotary position embedding (rotate-half layout) with default, linear, llama3 and YaRN
scaling, and Phi-3's partial rotary and LongRoPE.

The cos/sin tables cover every position up to max_position_embeddings, built once, so a
step only indexes them; the model looks them up once per forward and every layer reuses
them.

LongRoPE (``LongRopeEmbedding``) keeps two tables, short and long factors, and picks one
per sequence of a step, as transformers' ``dynamic_rope_update`` picks one per forward:
see ``LongRopeEmbedding.lookup`` for the rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from kernels import AttentionMetadata

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_inv_freq(
    head_dim: int, theta: float, scaling: Mapping[str, Any] | None
) -> torch.Tensor:
    """Per-pair inverse frequencies [head_dim // 2] in float32, after the scaling rule."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    rope_type = rope_type_of(scaling)
    if rope_type == "default":
        return inv_freq
    assert scaling is not None
    factor = float(_require(scaling, "factor"))
    if rope_type == "linear":
        # Dividing the frequencies equals dividing the positions by `factor`.
        return inv_freq / factor
    if rope_type == "yarn":
        return _yarn_inv_freq(inv_freq, head_dim, theta, factor, scaling)
    return _llama3_inv_freq(inv_freq, factor, scaling)


def rope_attention_factor(scaling: Mapping[str, Any] | None) -> float:
    """The factor cos and sin are scaled by: YaRN's (its ``attention_factor``, else
    0.1 ln(factor) + 1, or the mscale ratio DeepSeek-style configs give); 1 elsewhere."""
    if rope_type_of(scaling) != "yarn":
        return 1.0
    assert scaling is not None
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(_require(scaling, "factor"))

    def mscale(m: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return mscale(float(scaling["mscale"])) / mscale(float(scaling["mscale_all_dim"]))
    return mscale()


def _yarn_inv_freq(inv_freq: torch.Tensor, head_dim: int, theta: float, factor: float,
                   scaling: Mapping[str, Any]) -> torch.Tensor:
    """YaRN (gpt-oss): frequencies that turn fewer than beta_slow times over the original
    context are interpolated (divided by `factor`), those turning more than beta_fast
    times kept, and a linear ramp between them over the pair index, as transformers'
    _compute_yarn_parameters (``truncate`` rounds the ramp's ends outwards, the default)."""
    original = float(_require(scaling, "original_max_position_embeddings"))
    beta_fast = float(scaling.get("beta_fast") or 32)
    beta_slow = float(scaling.get("beta_slow") or 1)

    def pair_of(rotations: float) -> float:  # the pair index turning `rotations` times
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_of(beta_fast), pair_of(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # keeps the ramp finite
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the original frequency, 0: interpolated
    return inv_freq / factor * (1 - keep) + inv_freq * keep


def _llama3_inv_freq(
    inv_freq: torch.Tensor, factor: float, scaling: Mapping[str, Any]
) -> torch.Tensor:
    """Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, and the band
    between them interpolated smoothly."""
    low_freq_factor = float(_require(scaling, "low_freq_factor"))
    high_freq_factor = float(_require(scaling, "high_freq_factor"))
    original_context = float(_require(scaling, "original_max_position_embeddings"))
    if high_freq_factor <= low_freq_factor:
        raise ValueError(
            "rope_scaling.high_freq_factor must exceed low_freq_factor, got "
            f"{high_freq_factor} <= {low_freq_factor}"
        )
    low_freq_wavelen = original_context / low_freq_factor
    high_freq_wavelen = original_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    slowed = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * slowed / factor + smooth * slowed
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, blended, slowed)


def proportional_inv_freq(head_dim: int, theta: float, rotary_factor: float,
                          factor: float = 1.0) -> torch.Tensor:
    """Gemma 4's proportional rope [head_dim // 2]: the first ``rotary_factor`` of each
    half's pairs turn at theta ** (-2i / head_dim) (the exponent over the whole head, not
    the rotated part), the rest not at all (frequency 0), all divided by ``factor``."""
    angles = int(rotary_factor * head_dim // 2)
    exponents = torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / head_dim
    rotated = 1.0 / (theta**exponents)
    return torch.cat((rotated, torch.zeros(head_dim // 2 - angles))) / factor


def rope_type_of(scaling: Mapping[str, Any] | None) -> str:
    """The scaling rule's name; configs spell it `rope_type` (or `type` in older files)."""
    if not scaling:
        return "default"
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"rope_scaling type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
        )
    return str(rope_type)


def _require(scaling: Mapping[str, Any], key: str) -> Any:
    if scaling.get(key) is None:
        raise ValueError(f"rope_scaling.{key} is required for rope type {rope_type_of(scaling)!r}")
    return scaling[key]


def rope_tables(
    inv_freq: torch.Tensor,
    num_positions: int,
    attention_factor: float,
    dtype: torch.dtype,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin [num_positions, 2 * len(inv_freq)] for positions 0.. in ``dtype``.

    Angles in float32 (as the reference models compute them), scaled by
    ``attention_factor`` (LongRoPE's; 1.0 elsewhere) in float32, then one cast to the
    activation dtype, which is where the reference casts them too. The width is the
    rotated width, with the sign of the rotate-half pairing folded into sin, so that
    apply_rotary is two multiplies and one add: x * cos + swap_halves(x) * sin, where the
    first half of sin is negated."""
    angles = torch.outer(torch.arange(num_positions, dtype=torch.float32), inv_freq)
    cos, sin = angles.cos(), angles.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return (torch.cat((cos, cos), dim=-1).to(dtype=dtype, device=device),
            torch.cat((-sin, sin), dim=-1).to(dtype=dtype, device=device))


class RotaryEmbedding(nn.Module):
    def __init__(
        self,
        head_dim: int,
        max_position: int,
        theta: float,
        scaling: Mapping[str, Any] | None,
        dtype: torch.dtype,
        device: torch.device | str,
        inv_freq: torch.Tensor | None = None,
    ) -> None:
        """``inv_freq``: the frequencies when a family computes its own (Gemma 4's
        proportional rope); else from theta and the scaling rule."""
        super().__init__()
        if head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embedding, got {head_dim}")
        self.max_position = max_position
        if inv_freq is None:
            inv_freq = rope_inv_freq(head_dim, theta, scaling)
        cos, sin = rope_tables(inv_freq, max_position, rope_attention_factor(scaling), dtype,
                               device)
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def lookup(self, positions: torch.Tensor,
               meta: object = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin for each position, shaped [T, 1, head_dim] to broadcast over heads.
        ``meta`` (the step's AttentionMetadata) is not needed: every sequence turns by the
        same angles; LongRopeEmbedding.lookup, which takes the same arguments, needs it."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate [T, heads, head_dim] by the angles of its positions (rotate-half pairing:
    element i pairs with element i + head_dim // 2); cos/sin from RotaryEmbedding.lookup.

    Written as few ops as it can be: at one token per step each op's fixed cost, not its
    arithmetic, is what a decode step pays, 30 layers over."""
    swapped = x.unflatten(-1, (2, x.shape[-1] // 2)).flip(-2).flatten(-2)
    return torch.addcmul(x * cos, swapped, sin)


def apply_partial_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Partial rotary (Phi-4-mini's partial_rotary_factor): only the first
    ``rotary_dim = cos.shape[-1]`` dims of each head rotate, rotate-half paired within them
    (element i with i + rotary_dim // 2); the rest pass through unchanged, as transformers'
    apply_rotary_pos_emb does with narrow cos/sin. A full-width table is apply_rotary."""
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return apply_rotary(x, cos, sin)
    return torch.cat((apply_rotary(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]), dim=-1)


def longrope_inv_freq(rotary_dim: int, theta: float, factors: Sequence[float]) -> torch.Tensor:
    """LongRoPE's inverse frequencies [rotary_dim // 2] in float32: each pair's base
    frequency divided by its rescale factor, computed in transformers' order
    (1 / (factor * theta ** (2i / rotary_dim)))."""
    if len(factors) != rotary_dim // 2:
        raise ValueError(f"LongRoPE needs {rotary_dim // 2} rescale factors (rotary dims / 2), "
                         f"got {len(factors)}")
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (torch.tensor(list(factors), dtype=torch.float32) * theta**exponents)


def longrope_attention_factor(max_position: int, original_max_position: int,
                              factor: float | None = None,
                              attention_factor: float | None = None) -> float:
    """The scale LongRoPE applies to cos and sin (so to the rotated dims of q and k), short
    and long alike: the config's attention_factor, else sqrt(1 + ln(s) / ln(original)) with
    s = the config's factor, else max_position / original (1.0 when s <= 1), as
    transformers' _compute_longrope_parameters."""
    if attention_factor is not None:
        return float(attention_factor)
    scale = max_position / original_max_position if factor is None else float(factor)
    if scale <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(scale) / math.log(original_max_position))


class LongRopeEmbedding(nn.Module):
    """Phi-3's LongRoPE: short factors while a sequence is within the pretraining length,
    long factors once it is longer; both tables scaled by the attention factor.

    One table holds both: rows [0, short_rows) are the short table (a sequence of length
    <= original has positions < original only), rows from short_rows on are the long
    table for positions 0 .. max_position - 1, so a lookup is one gather at position +
    offset, offset = short_rows for tokens of long sequences."""

    def __init__(
        self,
        rotary_dim: int,
        max_position: int,
        theta: float,
        short_factor: Sequence[float],
        long_factor: Sequence[float],
        original_max_position: int,
        attention_factor: float,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        if rotary_dim % 2 != 0:
            raise ValueError(f"the rotary width must be even, got {rotary_dim}")
        self.max_position = max_position
        self.original_max_position = original_max_position
        self.short_rows = min(original_max_position, max_position)
        short = rope_tables(longrope_inv_freq(rotary_dim, theta, short_factor), self.short_rows,
                            attention_factor, dtype, device)
        long = rope_tables(longrope_inv_freq(rotary_dim, theta, long_factor), max_position,
                           attention_factor, dtype, device)
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", torch.cat((short[0], long[0])), persistent=False)
        self.register_buffer("sin", torch.cat((short[1], long[1])), persistent=False)

    def lookup(self, positions: torch.Tensor,
               meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin [T, 1, rotary_dim] for a step's tokens.

        The rule, per sequence of the step: all of sequence i's tokens in this step use
        the long factors when seq_lens[i] (its length after the step, i.e. its largest
        position + 1) exceeds original_max_position, else the short ones. That is
        transformers' dynamic_rope_update (seq_len = max(position_ids) + 1, one choice per
        forward) applied to each sequence as its own forward over a cache. Unlike a
        per-token rule (position p long iff p >= original), a step that ends past the
        pretraining length rotates its earlier positions with long factors too, and keys
        cached by earlier, shorter steps keep their short rotation: the result depends on
        how the sequence was chunked (transformers' generate() instead drops its cache
        and recomputes everything with long factors when a sequence first crosses)."""
        if meta.max_seq_len <= self.original_max_position:
            index = positions
        else:
            offsets = (meta.seq_lens > self.original_max_position).to(positions.dtype)
            offsets = offsets * self.short_rows
            q_lens = meta.query_start_loc[1:] - meta.query_start_loc[:-1]
            index = positions + torch.repeat_interleave(offsets, q_lens,
                                                        output_size=positions.shape[0])
        return self.cos[index].unsqueeze(1), self.sin[index].unsqueeze(1)
