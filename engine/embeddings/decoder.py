"""A decoder embedder (Qwen3-Embedding and the like) on Folio's own model code: the
family's ``CausalLM`` forward returns the final-norm hidden states, and the embedding is a
text's last token's (pooling.py).

One forward reads a whole batch as one step of prefills: each text a sequence of its own
in a scratch paged KV pool made for the batch (blocks handed out in order, freed with the
batch), so the attention is the engine's own kernel and the texts never see one another.
No KV is kept: an embedding is computed once, and the vectors are what is stored.
"""

from __future__ import annotations

import torch

from kernels import AttentionMetadata, allocate_kv_cache, get_backend

BLOCK = 16  # tokens per block of the scratch pool


class DecoderEncoder:
    """``forward(ids [B, S], lengths)`` -> final-norm hidden states [B, S, H] (rows past a
    text's length are zero)."""

    # Tokens per forward: the scratch pool holds every layer's float32 K/V of the batch
    # (Qwen3-Embedding-0.6B: 224 KiB a token, so 1,024 tokens take 224 MiB).
    batch_tokens = 1024

    def __init__(self, model, source: str) -> None:
        heads = set(model.kv_heads())
        if model.linear_layers() or len(heads) != 1 or \
                any(w is not None for w in model.layer_windows()):
            raise ValueError(f"{source}: a decoder embedder must have full attention with "
                             "one KV shape in every layer (Llama, Qwen2, Qwen3 and Mistral "
                             "without a window do)")
        self.model = model
        ((self._kv_heads, self._head_dim),) = heads
        self.backend = get_backend("cpu")

    @property
    def max_positions(self) -> int:
        return self.model.max_context_len

    @property
    def hidden_size(self) -> int:
        return self.model.spec.hidden_size

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        batch, seq = ids.shape
        blocks = [-(-n // BLOCK) for n in lengths]
        cache = allocate_kv_cache(self.model.spec.num_layers, sum(blocks), BLOCK,
                                  self._kv_heads, self._head_dim, self.model.dtype, "cpu",
                                  head_major=self.backend.head_major_kv)
        tables = torch.zeros((batch, max(blocks)), dtype=torch.int32)
        slots, positions, start = [], [], 0
        for i, (n, b) in enumerate(zip(lengths, blocks, strict=True)):
            tables[i, :b] = torch.arange(start, start + b, dtype=torch.int32)
            slots.append(torch.arange(n) + start * BLOCK)
            positions.append(torch.arange(n))
            start += b
        starts = torch.zeros(batch + 1, dtype=torch.int32)
        starts[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
        meta = AttentionMetadata(starts, torch.tensor(lengths, dtype=torch.int32), tables,
                                 torch.cat(slots), max(lengths), max(lengths))
        flat = torch.cat([ids[i, :n] for i, n in enumerate(lengths)])
        layers = [(cache[i, 0], cache[i, 1], meta) for i in range(cache.shape[0])]
        hidden = self.model(flat, torch.cat(positions), layers, meta, self.backend)
        out = hidden.new_zeros((batch, seq, hidden.shape[-1]))
        for i, rows in enumerate(hidden.split(lengths)):
            out[i, :rows.shape[0]] = rows
        return out
