"""The model families Folio runs: the one table that the loaders, the GGUF reader, the
models catalog and the memory estimates read.

A family is declared once, here: the names it goes by in a Hugging Face config
(``architectures``, ``model_type``) and in a GGUF file (``general.architecture``), how
llama.cpp stored its Q/K rows, the traits that shape its DecoderSpec, and the model class
that builds it (which also knows its checkpoint's parameter names and shapes).
``docs/ADDING_A_MODEL_FAMILY.md`` walks through adding one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from engine.dtypes import resolve_dtype
from engine.models.gemma import GemmaForCausalLM, gemma_spec
from engine.models.gemma4 import Gemma4ForCausalLM
from engine.models.gemma4_spec import gemma4_spec
from engine.models.gpt_oss import GptOssForCausalLM, gpt_oss_spec, split_expert_shapes
from engine.models.llama import LlamaForCausalLM
from engine.models.moe_decoder import MoEForCausalLM, moe_spec
from engine.models.phi3 import Phi3ForCausalLM, phi3_spec
from engine.models.qwen35 import Qwen35ForCausalLM, qwen35_spec
from engine.models.qwen35_moe import Qwen35MoeForCausalLM, qwen35_moe_spec
from engine.models.spec import DecoderSpec, FamilyTraits, spec_from_hf_config

SpecBuilder = Callable[[Any, str, FamilyTraits], DecoderSpec]

# llama.cpp's per-layer tensor names (blk.N.<part>.weight|bias, the parts of
# gguf.constants.TENSOR_NAMES) -> the Hugging Face names under model.layers.N. The Llama
# map, which Mistral and Qwen files use too:
GGUF_LLAMA_BLOCK_NAMES: Mapping[str, str] = MappingProxyType({
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
})
# Gemma 2 (MODEL_TENSORS[GEMMA2]): sandwich norms. llama.cpp's post_attention_norm is HF's
# post_attention_layernorm (after attention), and its ffn_norm is pre_feedforward_layernorm
# (before the MLP), not Llama's post_attention_layernorm.
GGUF_GEMMA2_BLOCK_NAMES: Mapping[str, str] = MappingProxyType({
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
})
# Gemma 3 (MODEL_TENSORS[GEMMA3]): Gemma 2's, and q/k norms.
GGUF_GEMMA3_BLOCK_NAMES: Mapping[str, str] = MappingProxyType({
    **GGUF_GEMMA2_BLOCK_NAMES,
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
})
# Gemma 4 (MODEL_TENSORS[GEMMA4], its dense text part): Gemma 3's, the layer scalar and
# the per-layer embeddings' gate, projection and norm.
GGUF_GEMMA4_BLOCK_NAMES: Mapping[str, str] = MappingProxyType({
    **GGUF_GEMMA3_BLOCK_NAMES, "layer_output_scale": "layer_scalar",
    "inp_gate": "per_layer_input_gate", "proj": "per_layer_projection",
    "post_norm": "post_per_layer_input_norm",
})
# Phi-3 (MODEL_TENSORS[PHI3]): the fused matrices as HF stores them, q/k/v rows in one
# attn_qkv, and ffn_up holding gate then up rows (2 * intermediate_size of them).
GGUF_PHI3_BLOCK_NAMES: Mapping[str, str] = MappingProxyType({
    "attn_qkv": "self_attn.qkv_proj", "attn_output": "self_attn.o_proj",
    "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
})

# Qwen3.5 (MODEL_TENSORS[QWEN35]): the Llama names for the full-attention layers (q_proj
# holding each head's query and gate), post_attention_norm before the MLP, and the linear
# layers' in attn_qkv / attn_gate / ssm_*. A name with its kind ("ssm_dt.bias") or without
# one ("ssm_a") is a whole parameter name.
GGUF_QWEN35_BLOCK_NAMES: Mapping[str, str] = MappingProxyType({
    **{k: v for k, v in GGUF_LLAMA_BLOCK_NAMES.items() if k != "ffn_norm"},
    "post_attention_norm": "post_attention_layernorm",
    "attn_qkv": "linear_attn.in_proj_qkv", "attn_gate": "linear_attn.in_proj_z",
    "ssm_alpha": "linear_attn.in_proj_a", "ssm_beta": "linear_attn.in_proj_b",
    "ssm_conv1d": "linear_attn.conv1d", "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj", "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_a": "linear_attn.A_log",
})

# Mixture-of-experts files (OLMoE, Qwen3-MoE, Mixtral's "llama" ones): the router and the
# experts' stacked 3-D tensors, which the loader hands over one expert at a time ("{}").
_GGUF_EXPERT_NAMES = {"ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.{}.gate_proj",
                      "ffn_up_exps": "mlp.experts.{}.up_proj",
                      "ffn_down_exps": "mlp.experts.{}.down_proj"}
GGUF_MOE_BLOCK_NAMES: Mapping[str, str] = MappingProxyType({
    **{k: v for k, v in GGUF_LLAMA_BLOCK_NAMES.items() if not k.startswith("ffn_")},
    "ffn_norm": "post_attention_layernorm", **_GGUF_EXPERT_NAMES,
    # Qwen3-MoE's dense layers (mlp_only_layers), where a model has them.
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
})
GGUF_MIXTRAL_BLOCK_NAMES: Mapping[str, str] = MappingProxyType({
    **{k: v for k, v in GGUF_LLAMA_BLOCK_NAMES.items() if not k.startswith("ffn_")},
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate_inp": "block_sparse_moe.gate", "ffn_gate_exps": "block_sparse_moe.experts.{}.w1",
    "ffn_up_exps": "block_sparse_moe.experts.{}.w3",
    "ffn_down_exps": "block_sparse_moe.experts.{}.w2",
})

# Qwen3.5-MoE (MODEL_TENSORS[QWEN35MOE]): Qwen3.5's, every layer's MLP the router, the
# stacked experts and the shared expert with its gate.
GGUF_QWEN35_MOE_BLOCK_NAMES: Mapping[str, str] = MappingProxyType({
    **{k: v for k, v in GGUF_QWEN35_BLOCK_NAMES.items() if not k.startswith("ffn_")},
    **_GGUF_EXPERT_NAMES, "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj", "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
})

# gpt-oss (MODEL_TENSORS[GPT_OSS]): Llama's attention with biases and sinks, llama.cpp's
# post_attention_norm before the experts, biased router and experts.
GGUF_GPT_OSS_BLOCK_NAMES: Mapping[str, str] = MappingProxyType({
    **{k: v for k, v in GGUF_MOE_BLOCK_NAMES.items() if k in (
        "attn_q", "attn_k", "attn_v", "attn_output", "attn_norm", "ffn_gate_exps",
        "ffn_up_exps", "ffn_down_exps")},
    "attn_sinks": "self_attn.sinks", "post_attention_norm": "post_attention_layernorm",
    "ffn_gate_inp": "mlp.router",
})


@dataclass(slots=True, frozen=True)
class ModelFamily:
    architecture: str  # the Hugging Face class name, e.g. "LlamaForCausalLM"
    model_type: str  # config.json's model_type, e.g. "llama"
    # GGUF general.architecture values that hold this family (Mistral and SmolLM files
    # say "llama", so they load as the llama family).
    gguf_architectures: tuple[str, ...]
    # llama.cpp reorders Q/K rows for its rope kernel in these files ("llama" only; Qwen
    # runs NEOX-style rope and keeps Hugging Face's order).
    gguf_rope_permuted: bool
    traits: FamilyTraits
    model_class: type[nn.Module]
    # Reads the config into the spec the model class takes.
    build_spec: SpecBuilder = spec_from_hf_config
    # GGUF block tensor parts -> HF names under model.layers.N (the GGUF_*_BLOCK_NAMES
    # above); a tensor whose part is not here fails the load, naming it.
    gguf_block_names: Mapping[str, str] = field(default_factory=lambda: GGUF_LLAMA_BLOCK_NAMES)
    # llama.cpp's converter added this to every tensor whose HF name ends in "norm.weight"
    # (Gemma's RMSNorm scales by 1 + weight; llama.cpp's by weight); the loader subtracts it.
    gguf_norm_offset: float = 0.0
    # The GGUF architecture whose files hold this family when they have experts
    # ({arch}.expert_count > 0): Mixtral's files say "llama".
    gguf_experts_of: str | None = None
    # The family's turn format (engine/text/turn_formats.py) for a file without a chat
    # template.
    turn_format: str = "chatml"
    # A checkpoint's tensor shapes (name -> shape) under the model's own names, where its
    # files fuse what the model keeps apart (gpt-oss's experts); None: the same names.
    split_shapes: Callable[[dict[str, tuple[int, ...]]], dict[str, tuple[int, ...]]] | None = None
    # HF names ending so that get no norm offset (Qwen3.5's gated norm scales by weight).
    gguf_unshifted_norms: tuple[str, ...] = ()
    # What the family's transformers config class fills in that a GGUF file's keys or a
    # config.json may leave out and the model reads. Set: a first load builds the config
    # from the file's values and these (engine/loaders/gguf/file_config.py's
    # config_from_values), importing no transformers model code; None: transformers' class
    # builds it (families whose class derives more than defaults: layer patterns,
    # per-layer shapes, expert settings).
    config_defaults: Mapping[str, object] | None = None


FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily("LlamaForCausalLM", "llama", ("llama",), True,
                FamilyTraits(mlp_bias_from_config=True), LlamaForCausalLM,
                turn_format="llama3", config_defaults=MappingProxyType(
                    {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
                     "rope_theta": 10000.0})),
    ModelFamily("MistralForCausalLM", "mistral", (), True,
                FamilyTraits(o_bias_from_config=False), LlamaForCausalLM,
                turn_format="mistral"),
    ModelFamily("Qwen2ForCausalLM", "qwen2", ("qwen2",), False,
                FamilyTraits(qkv_bias_always=True, o_bias_from_config=False), LlamaForCausalLM,
                config_defaults=MappingProxyType(
                    {"hidden_act": "silu", "use_sliding_window": False,
                     "rope_theta": 10000.0})),
    ModelFamily("Qwen3ForCausalLM", "qwen3", ("qwen3",), False,
                FamilyTraits(qk_norm=True), LlamaForCausalLM,
                config_defaults=MappingProxyType(
                    {"hidden_act": "silu", "attention_bias": False,
                     "use_sliding_window": False, "rope_theta": 10000.0})),
    # llama.cpp keeps Gemma's Q/K rows in HF order (NEOX rope) and adds 1 to every norm
    # weight, q/k norms included (Gemma2Model / Gemma3Model in convert_hf_to_gguf.py).
    ModelFamily("Gemma2ForCausalLM", "gemma2", ("gemma2",), False,
                FamilyTraits(), GemmaForCausalLM, gemma_spec,
                gguf_block_names=GGUF_GEMMA2_BLOCK_NAMES, gguf_norm_offset=1.0,
                turn_format="gemma"),
    ModelFamily("Gemma3ForCausalLM", "gemma3_text", ("gemma3",), False,
                FamilyTraits(qk_norm=True), GemmaForCausalLM, gemma_spec,
                gguf_block_names=GGUF_GEMMA3_BLOCK_NAMES, gguf_norm_offset=1.0,
                turn_format="gemma"),
    # Gemma 4 text (engine/models/gemma4.py). llama.cpp converts the multimodal checkpoint
    # (Gemma4ForConditionalGeneration) to a "gemma4" file of its text part, Q/K rows in HF
    # order and norms as stored (its RMSNorm scales by the weight itself: no offset).
    ModelFamily("Gemma4ForCausalLM", "gemma4_text", ("gemma4",), False,
                FamilyTraits(qk_norm=True), Gemma4ForCausalLM, gemma4_spec,
                gguf_block_names=GGUF_GEMMA4_BLOCK_NAMES, turn_format="gemma4"),
    # llama.cpp keeps Phi-3's fused qkv in HF row order (NEOX rope): not permuted. Its
    # rope_factors_long/short tensors are LongRoPE's factors, read into the config.
    ModelFamily("Phi3ForCausalLM", "phi3", ("phi3",), False, FamilyTraits(), Phi3ForCausalLM,
                phi3_spec, gguf_block_names=GGUF_PHI3_BLOCK_NAMES, turn_format="phi3"),
    # Mixtures of experts (engine/models/moe_decoder.py). llama.cpp keeps OLMoE's and Qwen3-MoE's
    # Q/K rows in HF order (NEOX rope); Mixtral is converted as Llama, rows permuted.
    ModelFamily("OlmoeForCausalLM", "olmoe", ("olmoe",), False, FamilyTraits(),
                MoEForCausalLM, moe_spec, gguf_block_names=GGUF_MOE_BLOCK_NAMES),
    ModelFamily("Qwen3MoeForCausalLM", "qwen3_moe", ("qwen3moe",), False,
                FamilyTraits(qk_norm=True), MoEForCausalLM, moe_spec,
                gguf_block_names=GGUF_MOE_BLOCK_NAMES),
    ModelFamily("MixtralForCausalLM", "mixtral", (), True,
                FamilyTraits(o_bias_from_config=False), MoEForCausalLM, moe_spec,
                gguf_block_names=GGUF_MIXTRAL_BLOCK_NAMES, gguf_experts_of="llama",
                turn_format="mistral"),
    # gpt-oss (engine/models/gpt_oss.py): NEOX rope, rows in HF order.
    ModelFamily("GptOssForCausalLM", "gpt_oss", ("gpt-oss",), False, FamilyTraits(),
                GptOssForCausalLM, gpt_oss_spec, gguf_block_names=GGUF_GPT_OSS_BLOCK_NAMES,
                split_shapes=split_expert_shapes, turn_format="harmony"),
    # Hybrid linear attention (engine/models/qwen35.py): Gated DeltaNet and gated full
    # attention layers. llama.cpp keeps its Q/K rows in HF order (NEOX rope).
    # llama.cpp adds 1 to its zero-centred norms, not to the linear layers' gated one.
    ModelFamily("Qwen3_5ForCausalLM", "qwen3_5_text", ("qwen35",), False,
                FamilyTraits(qk_norm=True), Qwen35ForCausalLM, qwen35_spec,
                gguf_block_names=GGUF_QWEN35_BLOCK_NAMES, gguf_norm_offset=1.0,
                gguf_unshifted_norms=("linear_attn.norm.weight",)),
    # Qwen3.5-MoE (engine/models/qwen35_moe.py): the same hybrid layers, sparse MLPs with
    # a shared expert.
    ModelFamily("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", ("qwen35moe",), False,
                FamilyTraits(qk_norm=True), Qwen35MoeForCausalLM, qwen35_moe_spec,
                gguf_block_names=GGUF_QWEN35_MOE_BLOCK_NAMES, gguf_norm_offset=1.0,
                gguf_unshifted_norms=("linear_attn.norm.weight",)),
)
# Multimodal checkpoints whose text part Folio runs (images only where engine/vision
# has the family's tower): the class ->
# the prefix of its text weights, which load under the text family's "model." names.
TEXT_PARTS: Mapping[str, str] = MappingProxyType({
    # SmolVLM / Idefics3: a Llama text model; its vision tower and connector are
    # engine/vision's.
    "Idefics3ForConditionalGeneration": "model.text_model.",
    # Gemma 3 (4B and up): Gemma 3 text, saved (by transformers 5 as in the releases)
    # under language_model.model.; its SigLIP tower and projector are engine/vision's
    # (engine/vision/gemma3.py).
    "Gemma3ForConditionalGeneration": "language_model.model.",
    "Gemma4ForConditionalGeneration": "model.language_model.",
    # The Qwen3.5 / Qwen3.6 releases (a vision tower, engine/vision/qwen35.py's, dense
    # and MoE alike, and mtp.* multi-token prediction weights
    # beside the text model, read only for speculative="mtp":
    # engine/loaders/safetensors.py, engine/models/qwen35_mtp.py).
    "Qwen3_5ForConditionalGeneration": "model.language_model.",
    "Qwen3_5MoeForConditionalGeneration": "model.language_model.",
})
# The multimodal classes whose images Folio reads too (engine/vision has their towers).
VISION_ARCHITECTURES: tuple[str, ...] = ("Idefics3ForConditionalGeneration",
                                          "Gemma3ForConditionalGeneration",
                                          "Gemma4ForConditionalGeneration",
                                          "Qwen3_5ForConditionalGeneration",
                                          "Qwen3_5MoeForConditionalGeneration")
# A multimodal checkpoint's top-level tensors that belong to its text model: an untied
# LM head (Qwen3.5's) sits beside the towers, not under the text prefix.
_TEXT_HEADS = ("lm_head.",)
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(f.architecture for f in FAMILIES)
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(f.model_type for f in FAMILIES)
GGUF_ARCHITECTURES: tuple[str, ...] = tuple(a for f in FAMILIES for a in f.gguf_architectures)
_BY_ARCHITECTURE = {f.architecture: f for f in FAMILIES}
_BY_MODEL_TYPE = {f.model_type: f for f in FAMILIES}
_BY_GGUF = {a: f for f in FAMILIES for a in f.gguf_architectures}
_BY_GGUF_EXPERTS = {f.gguf_experts_of: f for f in FAMILIES if f.gguf_experts_of}


def family_of(hf_config: Any) -> ModelFamily:
    """The family a config describes; ValueError naming it and the supported ones."""
    architectures = list(getattr(hf_config, "architectures", None) or [])
    for name in architectures:
        if name in _BY_ARCHITECTURE:
            return _BY_ARCHITECTURE[name]
    # Configs without an `architectures` list (hand-written ones) still name a model_type.
    model_type = getattr(hf_config, "model_type", None)
    if not architectures and model_type in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[model_type]
    described = ", ".join(architectures) if architectures else f"model_type {model_type!r}"
    raise ValueError(
        f"unsupported model architecture {described}; supported: "
        f"{', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def text_part(architectures: object) -> str | None:
    """The text weights' prefix when ``architectures`` (a config's list) names a
    multimodal class whose text part Folio runs, else None."""
    return next((TEXT_PARTS[a] for a in architectures or () if a in TEXT_PARTS), None)


def text_weight_name(name: str, prefix: str) -> str | None:
    """A multimodal checkpoint's tensor `name` under its text model's names (``prefix``:
    the TEXT_PARTS entry), or None for a tensor of the parts Folio does not run."""
    if name.startswith(prefix):
        return "model." + name[len(prefix):]
    return name if name.startswith(_TEXT_HEADS) else None


def gguf_family(gguf_architecture: object, expert_count: object = 0) -> ModelFamily | None:
    """The family of a GGUF file's general.architecture (and its {arch}.expert_count: a
    "llama" file with experts is Mixtral), or None when Folio has none."""
    if not isinstance(gguf_architecture, str):
        return None
    if isinstance(expert_count, int) and expert_count > 0:
        return _BY_GGUF_EXPERTS.get(gguf_architecture) or _BY_GGUF.get(gguf_architecture)
    return _BY_GGUF.get(gguf_architecture)


def gguf_file_family(metadata: Mapping[str, object]) -> ModelFamily | None:
    """The family of a GGUF file from its metadata."""
    arch = metadata.get("general.architecture")
    return gguf_family(arch, metadata.get(f"{arch}.expert_count", 0))


def resolve_architecture(hf_config: Any) -> str:
    return family_of(hf_config).architecture


def build_model(
    hf_config: Any,
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str = "cpu",
) -> nn.Module:
    """An empty (uninitialized) model for `hf_config`; fill it with load_weights."""
    family = family_of(hf_config)
    spec = family.build_spec(hf_config, family.architecture, family.traits)
    return family.model_class(spec, resolve_dtype(dtype), device)


def split_fused_shapes(hf_config: Any,
                       shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """A checkpoint's shapes under the names `checkpoint_shapes` gives (its family's
    ``split_shapes``), or as they are."""
    split = family_of(hf_config).split_shapes
    return split(shapes) if split is not None else shapes


def checkpoint_shapes(hf_config: Any) -> dict[str, tuple[int, ...]]:
    """Each parameter name a checkpoint for `hf_config` must hold -> its shape, as the
    model itself expects them (built on the meta device: no memory, no weights)."""
    model = build_model(hf_config, torch.float32, "meta")
    return {name: tuple(t.shape) for name, t in model.checkpoint_targets().items()}
