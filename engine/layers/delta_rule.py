"""The gated delta rule (Gated DeltaNet's token mixer) and its causal conv1d, in PyTorch.

A linear-attention head keeps a state S [key_dim, value_dim] instead of a KV entry per
token. Each token t decays it by exp(g_t), corrects what S already predicts for its key
by the delta rule, and reads it with its query:

    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T,   o_t = S_t^T q_t

Decode takes that step once per sequence (`recurrent_step`, batched over sequences). A
prompt goes by chunks of ``CHUNK`` tokens (`chunked_prefill`): inside a chunk the steps'
corrections solve as one unit-lower-triangular system (the WY / UT form), so a chunk is a
few matmuls, and only the chunks' states are scanned in order. The same state results
either way, so a prompt can stop at any token and resume by either path.

q and k are L2-normalized per head and q scaled by key_dim ** -0.5 before any of this,
as the reference model does. States are float32 whatever the activations: they add up
every token of the context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64  # tokens per chunk of the prefill: the reference's size, a few matmuls each


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def prepare_qk(query: torch.Tensor, key: torch.Tensor, num_v_heads: int,
               tiled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., k_heads, Dk] q and k to float32, normalized, q scaled, and each k head
    repeated for the value heads it serves: consecutive value heads share one (Hugging
    Face's order), or with ``tiled`` value head j uses k head j % k_heads (llama.cpp's
    files, whose value heads it reorders so)."""
    ratio = num_v_heads // query.shape[-2]
    query, key = l2_normalize(query.float()), l2_normalize(key.float())
    if ratio > 1:
        repeat = ((lambda x: x.repeat(*[1] * (x.dim() - 2), ratio, 1)) if tiled
                  else (lambda x: x.repeat_interleave(ratio, dim=-2)))
        query, key = repeat(query), repeat(key)
    return query * query.shape[-1] ** -0.5, key


def recurrent_step(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   g: torch.Tensor, beta: torch.Tensor,
                   state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence. query, key [B, H, Dk] (prepared), value [B, H, Dv],
    g, beta [B, H], state [B, H, Dk, Dv] float32 -> (out [B, H, Dv] float32, new state)."""
    state = state * g.float().exp()[..., None, None]
    predicted = torch.einsum("bhkv,bhk->bhv", state, key)
    delta = (value.float() - predicted) * beta.float()[..., None]
    state = state + key[..., :, None] * delta[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", state, query), state


def chunked_prefill(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor | None,
                    chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's T tokens. query, key [T, H, Dk] (prepared), value [T, H, Dv],
    g, beta [T, H], state [H, Dk, Dv] float32 or None (a fresh sequence) ->
    (out [T, H, Dv] float32, the state after the last token)."""
    num_tokens, heads, dk = key.shape
    dv = value.shape[-1]
    pad = (-num_tokens) % chunk
    # Heads first, then chunks: [H, N, C, D]. Padding tokens have g = 0 and beta = 0, so
    # they neither decay nor write the state.
    q, k, v = (F.pad(x.float().transpose(0, 1), (0, 0, 0, pad)).unflatten(1, (-1, chunk))
               for x in (query, key, value))
    g, beta = (F.pad(x.float().transpose(0, 1), (0, pad)).unflatten(1, (-1, chunk))
               for x in (g, beta))
    decay = g.cumsum(-1)  # log of the decay from the chunk's start through each token
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=key.device).tril()
    # exp(decay_i - decay_j) for j <= i, 0 above the diagonal.
    pair = (decay[..., :, None] - decay[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta[..., None]
    # Token i's correction reads the corrections of j < i: a unit lower triangular system
    # (the diagonal is the identity whatever k_beta k^T holds there).
    system = (k_beta @ k.transpose(-1, -2)) * pair
    system = system.masked_fill(~causal.tril(-1), 0.0) + torch.eye(chunk, device=key.device)
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False,
                                      unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * decay.exp()[..., None], upper=False,
                                      unitriangular=True)
    scores = (q @ k.transpose(-1, -2)) * pair  # inside the chunk, the diagonal included
    q_decayed = q * decay.exp()[..., None]
    last = decay[..., -1:]
    k_to_end = k * (last - decay).exp()[..., None]
    chunk_decay = last.exp()[..., None]  # [H, N, 1, 1]
    if state is None:
        state = torch.zeros(heads, dk, dv, dtype=torch.float32, device=key.device)
    state = state.float()
    out = torch.empty(heads, q.shape[1], chunk, dv, dtype=torch.float32, device=key.device)
    for n in range(q.shape[1]):
        v_new = u[:, n] - w[:, n] @ state
        out[:, n] = q_decayed[:, n] @ state + scores[:, n] @ v_new
        state = state * chunk_decay[:, n] + k_to_end[:, n].transpose(-1, -2) @ v_new
    return out.flatten(1, 2)[:, :num_tokens].transpose(0, 1), state


def conv_window(x: torch.Tensor, conv_state: torch.Tensor | None,
                width: int) -> torch.Tensor:
    """The conv's input over T tokens x [T, C]: [C, K - 1 + T], the K - 1 inputs before
    them (``conv_state`` [C, K - 1]; None: zeros), then their own. The conv state after
    n of the tokens is its columns [n, n + K - 1)."""
    if conv_state is None:
        conv_state = x.new_zeros(x.shape[1], width - 1)
    return torch.cat((conv_state.to(x.dtype), x.transpose(0, 1)), dim=1)


def conv_of_window(window: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Causal depthwise conv1d and SiLU over a `conv_window` [C, K - 1 + T] -> [T, C]."""
    out = F.conv1d(window[None], weight[:, None, :], groups=window.shape[0])[0]
    return F.silu(out).transpose(0, 1)


def conv_prefill(x: torch.Tensor, weight: torch.Tensor,
                 conv_state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv1d and SiLU over one sequence's T tokens. x [T, C], weight
    [C, K], conv_state [C, K - 1] (the previous K - 1 inputs; None: zeros) ->
    (out [T, C], the state after the last token)."""
    window = conv_window(x, conv_state, weight.shape[-1])
    return conv_of_window(window, weight), window[:, -(weight.shape[-1] - 1):]


def conv_step(x: torch.Tensor, weight: torch.Tensor,
              conv_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: x [B, C], conv_state [B, C, K - 1] -> (out [B, C], new
    state)."""
    window = torch.cat((conv_state.to(x.dtype), x[..., None]), dim=-1)
    return F.silu((window * weight).sum(-1)), window[..., 1:]
