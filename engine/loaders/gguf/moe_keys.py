"""The GGUF keys of the mixtures of experts (OLMoE, Qwen3-MoE, Mixtral, gpt-oss) and of
the hybrid Qwen3.5 / Qwen3.5-MoE (linear-attention layers), over the shared Llama keys."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from engine.loaders.gguf.keys import GGUFKeys, f32
from engine.models.gemma import FULL, SLIDING
from engine.models.qwen35 import LINEAR, TILED_V_HEADS


def expert_counts(keys: GGUFKeys) -> tuple[int, int]:
    """The experts and how many a token takes (at most all of them)."""
    experts = keys.count("expert_count")
    used = keys.count("expert_used_count")
    if used > experts:
        raise keys.bad("expert_used_count", used, f"at most expert_count ({experts})")
    return experts, used


def moe_keys(keys: GGUFKeys, config: dict[str, object],
              tensors: Mapping[str, np.ndarray] | None) -> None:
    """The experts of OLMoE, Qwen3-MoE and Mixtral files: how many, how many a token takes,
    each one's size and whether the top k are rescaled (llama.cpp normalises Qwen3-MoE's
    and Mixtral's, not OLMoE's, unless the file says)."""
    experts, used = expert_counts(keys)
    model_type = config["model_type"]
    config["num_local_experts" if model_type == "mixtral" else "num_experts"] = experts
    config["num_experts_per_tok"] = used
    norm = keys.optional("expert_weights_norm")
    if norm is not None and not isinstance(norm, bool):
        raise keys.bad("expert_weights_norm", norm, "a flag")
    config["norm_topk_prob"] = (model_type != "olmoe") if norm is None else norm
    if model_type == "qwen3_moe":
        config["moe_intermediate_size"] = keys.count("expert_feed_forward_length")
        config["mlp_only_layers"] = []
        config["decoder_sparse_step"] = 1
    if model_type == "olmoe":
        clamp = keys.optional("attention.clamp_kqv")
        config["clip_qkv"] = None if clamp is None else f32(
            keys.positive("attention.clamp_kqv"))
    if model_type == "mixtral":
        config["sliding_window"] = None


def gpt_oss_keys(keys: GGUFKeys, config: dict[str, object],
                  tensors: Mapping[str, np.ndarray] | None) -> None:
    """gpt-oss (llama.cpp's GptOssModel): the experts, each of expert_feed_forward_length;
    sliding and full layers alternating (llama.cpp's swa pattern 2, as transformers'
    default layer_types), the window; YaRN as gpt-oss's config states it (its ramp ends
    not rounded, ``truncate`` false, which the file does not record). The SwiGLU's limit:
    swiglu_clamp_exp where a file states it, else gpt-oss's 7.0, which llama.cpp
    hard-codes (as its alpha, 1.702, the config's default)."""
    experts, used = expert_counts(keys)
    config["num_local_experts"] = experts
    config["num_experts_per_tok"] = used
    config["intermediate_size"] = keys.count("expert_feed_forward_length",
                                             config["intermediate_size"])
    layers = int(config["num_hidden_layers"])
    config["layer_types"] = [SLIDING if i % 2 == 0 else FULL for i in range(layers)]
    config["sliding_window"] = keys.count("attention.sliding_window")
    if keys.optional("swiglu_clamp_exp") is not None:
        config["swiglu_limit"] = f32(keys.positive("swiglu_clamp_exp"))
    rope = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}
    scaling = config.pop("rope_scaling", None)
    if isinstance(scaling, dict):
        rope |= {**scaling, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    config["rope_parameters"] = rope


def qwen35_keys(keys: GGUFKeys, config: dict[str, object],
                 tensors: Mapping[str, np.ndarray] | None) -> None:
    """Qwen3.5's linear layers (Qwen3NextModel's ssm.* keys), the layer period, the
    partial rotary and its M-RoPE sections, and llama.cpp's tiled value heads."""
    v_heads = keys.count("ssm.time_step_rank")
    inner = keys.count("ssm.inner_size")
    if inner % v_heads:
        raise keys.bad("ssm.inner_size", inner, f"a multiple of ssm.time_step_rank ({v_heads})")
    config |= {"linear_num_value_heads": v_heads, "linear_value_head_dim": inner // v_heads,
               "linear_num_key_heads": keys.count("ssm.group_count"),
               "linear_key_head_dim": keys.count("ssm.state_size"),
               "linear_conv_kernel_dim": keys.count("ssm.conv_kernel"), TILED_V_HEADS: True}
    period = keys.count("full_attention_interval", 4)
    config["layer_types"] = [FULL if (i + 1) % period == 0 else LINEAR
                             for i in range(int(config["num_hidden_layers"]))]
    head_dim = int(config["head_dim"])
    rotary = keys.count("rope.dimension_count", head_dim // 4)
    if rotary > head_dim or rotary % 2:
        raise keys.bad("rope.dimension_count", rotary,
                       f"an even number of dims of the {head_dim}-dim heads")
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": config.pop("rope_theta"),
                                 "partial_rotary_factor": rotary / head_dim}
    # M-RoPE's (time, height, width) frequency counts, which an image's tokens turn by
    # (llama.cpp's four sections; the fourth, unused by Qwen3.5, is 0); taken as a
    # folder's mrope_section is: text turns every section alike, whatever they are.
    sections = keys.optional("rope.dimension_sections")
    if isinstance(sections, tuple):
        if len(sections) < 3:
            raise keys.bad("rope.dimension_sections", sections, "three or four counts")
        config["rope_parameters"]["mrope_section"] = [int(n) for n in sections[:3]]


def qwen35_moe_keys(keys: GGUFKeys, config: dict[str, object],
                     tensors: Mapping[str, np.ndarray] | None) -> None:
    """Qwen3.5-MoE (Qwen3NextModel's keys for its experts): Qwen3.5's linear layers, the
    experts and the shared expert's width; the top k always rescaled (the model's rule)."""
    qwen35_keys(keys, config, tensors)
    experts, used = expert_counts(keys)
    config |= {"num_experts": experts, "num_experts_per_tok": used,
               "moe_intermediate_size": keys.count("expert_feed_forward_length"),
               "shared_expert_intermediate_size": keys.count(
                   "expert_shared_feed_forward_length")}
