"""How a batch's per-token hidden states become one vector per text: the first token
(``cls``: BERT's [CLS]), the mean over its tokens (``mean``) or its last token (``last``:
a decoder's, which alone has seen the whole text), then L2-normalized; and Matryoshka
truncation (the first ``dims`` values, normalized again)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the names here are read without torch (probe.py)
    import torch

CLS = "cls"
MEAN = "mean"
LAST = "last"
POOLINGS = (CLS, MEAN, LAST)

# llama.cpp's {arch}.pooling_type values (its enum llama_pooling_type).
GGUF_POOLINGS = {1: MEAN, 2: CLS, 3: LAST}


def pool(hidden: torch.Tensor, lengths: list[int], mode: str) -> torch.Tensor:
    """hidden [B, S, H] (each text's tokens first, padding after them) -> [B, H] float32."""
    import torch

    if mode not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {mode!r}")
    hidden = hidden.float()
    lens = torch.tensor(lengths, device=hidden.device)
    if mode == CLS:
        return hidden[:, 0]
    if mode == LAST:
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), lens - 1]
    mask = (torch.arange(hidden.shape[1], device=hidden.device)[None] < lens[:, None])
    return (hidden * mask[..., None]).sum(1) / lens[:, None].to(hidden.dtype)


def normalize(vectors: torch.Tensor) -> torch.Tensor:
    """Each row to unit length (a zero row stays zero)."""
    import torch

    return torch.nn.functional.normalize(vectors, p=2.0, dim=-1)


def truncate(vectors: torch.Tensor, dims: int) -> torch.Tensor:
    """Matryoshka truncation: the first ``dims`` values of each row, renormalized (what a
    model trained for it keeps most of its quality with)."""
    if not 1 <= dims <= vectors.shape[-1]:
        raise ValueError(f"dimensions must be in [1, {vectors.shape[-1]}], got {dims}")
    return normalize(vectors[..., :dims])
