"""The decoder's shape and options, read once from a Hugging Face config.

Reading every field here (instead of poking at the config inside the layers) keeps the
quirks of config versions in one place: transformers 5 moves rope_theta and rope_scaling
into `rope_parameters`; older files keep them at the top level and may spell the rope
type `type`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.dtypes import kv_format_of
from engine.layers.rotary import rope_type_of

if TYPE_CHECKING:
    import torch


@dataclass(slots=True)
class FamilyTraits:
    """The bias and q/k-norm switches that tell the registered families apart where they
    share a decoder class (engine/models/registry.py, ``FAMILIES``)."""

    qkv_bias_always: bool = False  # Qwen2: q/k/v carry a bias whatever the config says
    o_bias_from_config: bool = True  # o_proj's bias follows config.attention_bias
    mlp_bias_from_config: bool = False  # Llama's config.mlp_bias
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before rope


@dataclass(slots=True)
class DecoderSpec:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    # Mistral v0.1-style sliding-window attention on every layer; None = no window.
    sliding_window: int | None
    hidden_act: str = "silu"

    @property
    def max_context_len(self) -> int:
        """The longest context this model computes exactly (a sliding window limits what
        each token sees, not how long the context may grow)."""
        return self.max_position_embeddings


def spec_from_hf_config(hf_config: Any, architecture: str, traits: FamilyTraits) -> DecoderSpec:
    spec = base_spec(hf_config, architecture, traits)
    if spec.hidden_act != "silu":
        raise ValueError(f"hidden_act {spec.hidden_act!r} is not supported; the decoder uses "
                         "'silu'")
    return spec


def base_spec(hf_config: Any, architecture: str, traits: FamilyTraits,
              act_field: str = "hidden_act", read_rope: bool = True,
              size_field: str = "intermediate_size") -> DecoderSpec:
    """The fields every family's spec shares; ``act_field`` names the config's activation
    (Gemma calls it hidden_activation), ``size_field`` its MLP width (Qwen3.5-MoE, whose
    every layer is sparse, has only moe_intermediate_size). ``read_rope=False`` leaves
    the rope fields plain (theta 10000, no scaling) for a family that reads its own rope
    (Phi-3's partial rotary and LongRoPE, which the shared reader refuses)."""
    hidden_act = getattr(hf_config, act_field, None) or "silu"
    num_heads = int(_field(hf_config, "num_attention_heads"))
    hidden_size = int(_field(hf_config, "hidden_size"))
    num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
    head_dim = head_dim_of(getattr(hf_config, "head_dim", None), hidden_size, num_heads)
    attention_bias = bool(getattr(hf_config, "attention_bias", False))
    rope_theta, rope_scaling = _rope_settings(hf_config) if read_rope else (10000.0, None)
    return DecoderSpec(
        architecture=architecture,
        vocab_size=int(_field(hf_config, "vocab_size")),
        hidden_size=hidden_size,
        intermediate_size=int(_field(hf_config, size_field)),
        num_layers=int(_field(hf_config, "num_hidden_layers")),
        num_heads=num_heads,
        num_kv_heads=int(num_kv_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(_field(hf_config, "rms_norm_eps")),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=int(_field(hf_config, "max_position_embeddings")),
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        qkv_bias=traits.qkv_bias_always or attention_bias,
        o_bias=traits.o_bias_from_config and attention_bias,
        mlp_bias=traits.mlp_bias_from_config and bool(getattr(hf_config, "mlp_bias", False)),
        qk_norm=traits.qk_norm,
        sliding_window=_sliding_window(hf_config),
        hidden_act=str(hidden_act),
    )


def head_dim_of(head_dim: int | None, hidden_size: int, num_heads: int) -> int:
    """A config's head size: its own head_dim when it states one (Qwen3, Gemma), else
    hidden_size / num_attention_heads, as transformers assumes."""
    return int(head_dim or hidden_size // num_heads)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                       kv_dtype: torch.dtype | str) -> int:
    """KV cache bytes one token takes: a key and a value per layer and KV head, each a row
    of the KV format that ``kv_dtype`` (a pool's storage dtype or a kv_cache_dtype name)
    tags: ``head_dim`` values of a float dtype, or the quantized values and their scales
    (kernels/kv_format.py)."""
    return 2 * num_layers * num_kv_heads * kv_format_of(kv_dtype).row_bytes(head_dim)


def _field(hf_config: Any, name: str) -> Any:
    value = getattr(hf_config, name, None)
    if value is None:
        raise ValueError(f"model config is missing {name!r}")
    return value


def _rope_settings(hf_config: Any) -> tuple[float, dict[str, Any] | None]:
    params = getattr(hf_config, "rope_parameters", None)
    if not isinstance(params, dict):
        params = getattr(hf_config, "rope_scaling", None)
    params = dict(params) if isinstance(params, dict) else {}
    if "rope_theta" not in params and getattr(hf_config, "rope_theta", None) is not None:
        params["rope_theta"] = hf_config.rope_theta
    params.setdefault("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0))
    return rope_from_params(params)


def rope_from_params(params: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling or None) from one rope_parameters dict."""
    params = dict(params)
    theta = params.get("rope_theta")
    if theta is None:
        theta = 10000.0
    partial = params.get("partial_rotary_factor", 1.0)
    if partial not in (None, 1.0):
        raise ValueError(f"partial_rotary_factor {partial} is not supported; only 1.0 is")
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
    # Validates the type now, so an unsupported one fails at build time with its name.
    if rope_type_of(scaling) == "default":
        return float(theta), None
    return float(theta), scaling


def _sliding_window(hf_config: Any) -> int | None:
    window = getattr(hf_config, "sliding_window", None)
    # Qwen2/3 configs carry a window that is off unless use_sliding_window is set.
    if window is None or not getattr(hf_config, "use_sliding_window", True):
        return None
    return int(window)
