"""The BERT family's encoder, as Folio runs it: bidirectional post-norm layers over a
padded batch.

Two variants, by their checkpoints' names:

- ``bert`` (transformers' ``BertModel``: bge, all-MiniLM, e5): learned absolute
  positions and token types summed with the word embeddings, biased q/k/v, exact GELU.
- ``nomic-bert`` (nomic-embed-text's ``NomicBertModel``): no position table but rotary
  (rotate-half) on every head, one fused ``Wqkv`` without biases, a SwiGLU MLP
  (``fc11`` the up, ``fc12`` the gate, ``fc2`` the down).

Weights come in by Hugging Face name (a GGUF file's are renamed to these, bert_gguf.py),
``bert.`` / ``model.`` prefixes dropped and heads (pooler, MLM) skipped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

BERT = "bert"
NOMIC = "nomic-bert"
_SKIPPED = ("pooler.", "cls.", "lm_head.", "embeddings.position_ids")


@dataclass(slots=True, frozen=True)
class BertSpec:
    variant: str  # BERT or NOMIC
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int
    eps: float
    rope_base: float = 10000.0  # nomic-bert only

    @classmethod
    def of_config(cls, config: dict) -> BertSpec:
        """A config.json's fields (BertModel's or NomicBertModel's names)."""
        if config.get("model_type") == "nomic_bert" or "n_embd" in config:
            return cls(NOMIC, config["vocab_size"], config["n_embd"], config["n_layer"],
                       config["n_head"], config.get("n_inner") or 4 * config["n_embd"],
                       config.get("n_positions", 2048), config.get("type_vocab_size", 2),
                       config.get("layer_norm_epsilon", 1e-12),
                       config.get("rotary_emb_base", 10000.0))
        for key, allowed in (("hidden_act", ("gelu",)),
                             ("position_embedding_type", ("absolute",))):
            if config.get(key, allowed[0]) not in allowed:
                raise ValueError(f"config.json: {key} {config[key]!r}; Folio's BERT runs "
                                 f"{' or '.join(allowed)}")
        return cls(BERT, config["vocab_size"], config["hidden_size"],
                   config["num_hidden_layers"], config["num_attention_heads"],
                   config["intermediate_size"], config["max_position_embeddings"],
                   config.get("type_vocab_size", 2), config.get("layer_norm_eps", 1e-12))

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight the encoder takes, by name, with its shape."""
        h, f = self.hidden_size, self.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {
            "embeddings.word_embeddings.weight": (self.vocab_size, h),
            "embeddings.token_type_embeddings.weight": (self.type_vocab_size, h)}
        if self.variant == BERT:
            shapes["embeddings.position_embeddings.weight"] = (self.max_positions, h)
            shapes |= {"embeddings.LayerNorm.weight": (h,), "embeddings.LayerNorm.bias": (h,)}
            for i in range(self.num_layers):
                p = f"encoder.layer.{i}."
                for part in ("query", "key", "value"):
                    shapes |= {f"{p}attention.self.{part}.weight": (h, h),
                               f"{p}attention.self.{part}.bias": (h,)}
                shapes |= {f"{p}attention.output.dense.weight": (h, h),
                           f"{p}attention.output.dense.bias": (h,),
                           f"{p}attention.output.LayerNorm.weight": (h,),
                           f"{p}attention.output.LayerNorm.bias": (h,),
                           f"{p}intermediate.dense.weight": (f, h),
                           f"{p}intermediate.dense.bias": (f,),
                           f"{p}output.dense.weight": (h, f), f"{p}output.dense.bias": (h,),
                           f"{p}output.LayerNorm.weight": (h,), f"{p}output.LayerNorm.bias": (h,)}
            return shapes
        shapes |= {"emb_ln.weight": (h,), "emb_ln.bias": (h,)}
        for i in range(self.num_layers):
            p = f"encoder.layers.{i}."
            shapes |= {f"{p}attn.Wqkv.weight": (3 * h, h), f"{p}attn.out_proj.weight": (h, h),
                       f"{p}mlp.fc11.weight": (f, h), f"{p}mlp.fc12.weight": (f, h),
                       f"{p}mlp.fc2.weight": (h, f),
                       f"{p}norm1.weight": (h,), f"{p}norm1.bias": (h,),
                       f"{p}norm2.weight": (h,), f"{p}norm2.bias": (h,)}
        return shapes


def checkpoint_name(name: str) -> str | None:
    """A checkpoint tensor's name as the encoder knows it, or None for one it skips."""
    for prefix in ("bert.", "model."):
        name = name.removeprefix(prefix)
    return None if name.startswith(_SKIPPED) else name


class BertEncoder:
    """``forward(ids [B, S], lengths)`` -> the last layer's hidden states [B, S, H]."""

    batch_tokens = 4096  # padded tokens per forward

    def __init__(self, spec: BertSpec, weights: Iterable[tuple[str, torch.Tensor]],
                 source: str) -> None:
        self.spec = spec
        expected = spec.weight_shapes()
        self.w: dict[str, torch.Tensor] = {}
        for stored, tensor in weights:
            name = checkpoint_name(stored)
            if name is None:
                continue
            if name not in expected:
                raise ValueError(f"{source}: unexpected tensor {stored!r} for a "
                                 f"{spec.variant} encoder of {spec.num_layers} layers")
            if tuple(tensor.shape) != expected[name]:
                raise ValueError(f"{source}: tensor {stored!r} has shape "
                                 f"{list(tensor.shape)}, the config implies "
                                 f"{list(expected[name])}")
            self.w[name] = tensor.float().contiguous()
        missing = sorted(set(expected) - set(self.w))
        if missing:
            raise ValueError(f"{source}: {len(missing)} weights the config needs are "
                             f"missing (first: {', '.join(missing[:3])})")
        if spec.variant == NOMIC:
            head_dim = spec.hidden_size // spec.num_heads
            self._inv_freq = 1.0 / spec.rope_base ** (
                torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)

    @property
    def max_positions(self) -> int:
        return self.spec.max_positions

    @property
    def hidden_size(self) -> int:
        return self.spec.hidden_size

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        spec, w = self.spec, self.w
        batch, seq = ids.shape
        # Padded keys masked out: [B, 1, 1, S], True where a key is a token.
        keys = (torch.arange(seq)[None] < torch.tensor(lengths)[:, None])[:, None, None]
        x = w["embeddings.word_embeddings.weight"][ids] + \
            w["embeddings.token_type_embeddings.weight"][0]
        if spec.variant == BERT:
            x = x + w["embeddings.position_embeddings.weight"][:seq]
            x = self._norm(x, "embeddings.LayerNorm")
            for i in range(spec.num_layers):
                x = self._bert_layer(x, keys, f"encoder.layer.{i}.")
            return x
        x = self._norm(x, "emb_ln")
        cos, sin = self._rotary(seq)
        for i in range(spec.num_layers):
            x = self._nomic_layer(x, keys, cos, sin, f"encoder.layers.{i}.")
        return x

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.w[name + ".weight"], self.w[name + ".bias"],
                            self.spec.eps)

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, S, H] -> [B, heads, S, head_dim]."""
        b, s, _ = x.shape
        return x.view(b, s, self.spec.num_heads, -1).transpose(1, 2)

    def _attend(self, q, k, v, keys: torch.Tensor) -> torch.Tensor:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keys,
                                             scale=1.0 / math.sqrt(q.shape[-1]))
        b, _, s, _ = out.shape
        return out.transpose(1, 2).reshape(b, s, -1)

    def _bert_layer(self, x: torch.Tensor, keys: torch.Tensor, p: str) -> torch.Tensor:
        q, k, v = (self._heads(self._linear(x, f"{p}attention.self.{part}"))
                   for part in ("query", "key", "value"))
        attn = self._linear(self._attend(q, k, v, keys), f"{p}attention.output.dense")
        x = self._norm(attn + x, f"{p}attention.output.LayerNorm")
        mlp = F.gelu(self._linear(x, f"{p}intermediate.dense"))
        return self._norm(self._linear(mlp, f"{p}output.dense") + x, f"{p}output.LayerNorm")

    def _rotary(self, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        angles = torch.outer(torch.arange(seq, dtype=torch.float64), self._inv_freq)
        angles = torch.cat([angles, angles], -1)
        return angles.cos().float(), angles.sin().float()

    def _nomic_layer(self, x: torch.Tensor, keys: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, p: str) -> torch.Tensor:
        q, k, v = (self._heads(t) for t in self._linear(x, f"{p}attn.Wqkv").chunk(3, -1))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        attn = self._linear(self._attend(q, k, v, keys), f"{p}attn.out_proj")
        x = self._norm(attn + x, f"{p}norm1")
        mlp = self._linear(x, f"{p}mlp.fc11") * F.silu(self._linear(x, f"{p}mlp.fc12"))
        return self._norm(self._linear(mlp, f"{p}mlp.fc2") + x, f"{p}norm2")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary on [B, heads, S, D] with cos / sin [S, D]."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + turned * sin
