"""A synthetic OLMoE-1B-7B-shaped Q4_K_M GGUF for ``folio bench moe``: OLMoE's shapes
(16 layers of 64 experts, 8 per token, each of 1024 rows; 6.9B parameters, 1.3B active)
with random weights and the starter's tokenizer, a ``synthetic.Shape`` plus the expert
fields, written once into the cache by ``synthetic.ensure_synthetic_gguf`` and reused
(Qwen3-30B-A3B's 17 GiB would not leave this 24 GiB machine room to spare).

The tensors are llama.cpp's OLMoE ones: full-width q/k norms, the router
(``ffn_gate_inp``, F32 as llama.cpp keeps it, random so that tokens spread over the
experts) and each layer's experts stacked in ``ffn_{gate,up,down}_exps``; the matrices
in the Q4_K_M mix of ``synthetic.tensor_plan``, which lists them (Q6_K for attn_v and the
down experts of llama.cpp's more-bits layers, and for the output).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from engine.bench.synthetic import Planned, Shape


@dataclass(frozen=True, slots=True)
class MoEShape(Shape):
    """OLMoE's shape: ``intermediate`` is each expert's width (OLMoE has no dense MLP)."""

    arch: ClassVar[str] = "olmoe"
    qk_norm: ClassVar[bool] = True
    experts: int = 64
    experts_used: int = 8

    @property
    def label(self) -> str:
        return (f"olmoe-{self.layers}l-{self.hidden}h-{self.experts}x{self.intermediate}ff-"
                f"top{self.experts_used}")

    def gguf_keys(self) -> dict[str, int | float]:
        return Shape.gguf_keys(self) | {"expert_count": self.experts,
                                        "expert_used_count": self.experts_used}

    def ffn_plan(self, layer: int, more: str) -> list[Planned]:
        """The router (F32, random so that tokens spread) and the stacked experts."""
        h, e, f = self.hidden, self.experts, self.intermediate
        return [(f"blk.{layer}.ffn_gate_inp.weight", (e, h), "F32_RANDOM"),
                (f"blk.{layer}.ffn_gate_exps.weight", (e, f, h), "Q4_K"),
                (f"blk.{layer}.ffn_up_exps.weight", (e, f, h), "Q4_K"),
                (f"blk.{layer}.ffn_down_exps.weight", (e, h, f), more)]


OLMOE_1B_7B = MoEShape(layers=16, hidden=2048, heads=16, kv_heads=16, head_dim=128,
                       intermediate=1024, context=4096, rope_base=10000.0)
