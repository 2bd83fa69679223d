"""Model definitions and the registry that picks one for a Hugging Face config."""

from engine.dtypes import resolve_dtype
from engine.models.llama import LlamaForCausalLM
from engine.models.registry import (
    FAMILIES,
    GGUF_ARCHITECTURES,
    SUPPORTED_ARCHITECTURES,
    SUPPORTED_MODEL_TYPES,
    ModelFamily,
    build_model,
    checkpoint_shapes,
    family_of,
    gguf_family,
    gguf_file_family,
    resolve_architecture,
    split_fused_shapes,
)
from engine.models.spec import DecoderSpec

__all__ = [
    "FAMILIES",
    "GGUF_ARCHITECTURES",
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_MODEL_TYPES",
    "ModelFamily",
    "checkpoint_shapes",
    "family_of",
    "gguf_family",
    "gguf_file_family",
    "DecoderSpec",
    "LlamaForCausalLM",
    "build_model",
    "resolve_architecture",
    "resolve_dtype",
    "split_fused_shapes",
]
