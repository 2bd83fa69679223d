"""A synthetic OLMoE-1B-7B-shaped Q4_K_M GGUF for ``folio bench moe``: OLMoE's shapes
(16 layers of 64 experts, 8 per token, each of 1024 rows; 6.9B parameters, 1.3B active)
with random weights and the starter's tokenizer, written once into the cache by
``synthetic.write_random_gguf`` and reused (Qwen3-30B-A3B's 17 GiB would not leave this
24 GiB machine room to spare).

The tensors are llama.cpp's OLMoE ones: full-width q/k norms, the router
(``ffn_gate_inp``, F32 as llama.cpp keeps it, random so that tokens spread over the
experts) and each layer's experts stacked in ``ffn_{gate,up,down}_exps``; the matrices
in the Q4_K_M mix of ``synthetic.tensor_plan`` (Q6_K for attn_v and the down experts of
llama.cpp's more-bits layers, and for the output).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.bench.synthetic import synthetic_path, use_more_bits, write_random_gguf


@dataclass(frozen=True, slots=True)
class MoEShape:
    layers: int = 16
    hidden: int = 2048
    heads: int = 16
    kv_heads: int = 16
    head_dim: int = 128
    experts: int = 64
    experts_used: int = 8
    expert_size: int = 1024
    context: int = 4096
    rope_base: float = 10000.0

    @property
    def label(self) -> str:
        return (f"olmoe-{self.layers}l-{self.hidden}h-{self.experts}x{self.expert_size}ff-"
                f"top{self.experts_used}")


OLMOE_1B_7B = MoEShape()


def moe_tensor_plan(shape: MoEShape, vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(GGUF name, shape outermost first, type name) of every tensor, in file order."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    e, f = shape.experts, shape.expert_size
    plan = [("token_embd.weight", (vocab, h), "Q4_K")]
    for i in range(shape.layers):
        more = "Q6_K" if use_more_bits(i, shape.layers) else "Q4_K"
        plan += [
            (f"blk.{i}.attn_norm.weight", (h,), "F32"),
            (f"blk.{i}.attn_q.weight", (q, h), "Q4_K"),
            (f"blk.{i}.attn_k.weight", (kv, h), "Q4_K"),
            (f"blk.{i}.attn_v.weight", (kv, h), more),
            (f"blk.{i}.attn_q_norm.weight", (q,), "F32"),
            (f"blk.{i}.attn_k_norm.weight", (kv,), "F32"),
            (f"blk.{i}.attn_output.weight", (h, q), "Q4_K"),
            (f"blk.{i}.ffn_norm.weight", (h,), "F32"),
            (f"blk.{i}.ffn_gate_inp.weight", (e, h), "F32_RANDOM"),
            (f"blk.{i}.ffn_gate_exps.weight", (e, f, h), "Q4_K"),
            (f"blk.{i}.ffn_up_exps.weight", (e, f, h), "Q4_K"),
            (f"blk.{i}.ffn_down_exps.weight", (e, h, f), more),
        ]
    return plan + [("output_norm.weight", (h,), "F32"), ("output.weight", (vocab, h), "Q6_K")]


def ensure_synthetic_moe_gguf(tokenizer_gguf: Path, shape: MoEShape = OLMOE_1B_7B,
                              root: Path | None = None, rebuild: bool = False,
                              seed: int = 0) -> tuple[Path, bool]:
    """The synthetic file's path and whether this call wrote it (False: reused)."""
    path = synthetic_path(shape, root)
    if path.exists() and not rebuild:
        return path, False
    keys = {"block_count": shape.layers, "context_length": shape.context,
            "embedding_length": shape.hidden, "feed_forward_length": shape.expert_size,
            "attention.head_count": shape.heads, "attention.head_count_kv": shape.kv_heads,
            "rope.dimension_count": shape.head_dim, "rope.freq_base": shape.rope_base,
            "attention.layer_norm_rms_epsilon": 1e-5, "expert_count": shape.experts,
            "expert_used_count": shape.experts_used}
    write_random_gguf(path, tokenizer_gguf, "olmoe", shape.label, keys,
                      lambda vocab: moe_tensor_plan(shape, vocab), seed)
    return path, True
