"""Model definitions and the registry that picks one for a Hugging Face config."""

from engine.models.llama import LlamaForCausalLM
from engine.models.registry import (
    SUPPORTED_ARCHITECTURES,
    build_model,
    resolve_architecture,
    resolve_dtype,
)
from engine.models.spec import DecoderSpec

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "DecoderSpec",
    "LlamaForCausalLM",
    "build_model",
    "resolve_architecture",
    "resolve_dtype",
]
