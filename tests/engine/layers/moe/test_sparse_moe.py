"""The MoE block (engine/layers/moe/) against transformers' routers and sparse blocks of
each family (Qwen3.5-MoE's with its shared expert), in float32 with tied router scores;
the expert-grouped step against a per-token loop, in float and on quantized experts; and
that a step reads only the experts its tokens were routed to."""

from __future__ import annotations

import pytest
import torch

import kernels.cpu
from engine.layers.moe.router import TopKRouter
from engine.layers.moe.sparse import SparseMoE
from kernels.quant.formats import QuantizedTensor
from tests.engine.tiny_models import peaked_weights, tiny_qwen35_moe_config
from tests.engine.tiny_moe import FAMILIES, moe_model
from tests.kernels.quant_cases import random_quantized

pytestmark = pytest.mark.usefixtures("single_torch_thread")

HIDDEN = 64
BLOCK_FAMILIES = (*FAMILIES, "qwen3_5_moe")


def hf_block(family: str) -> torch.nn.Module:
    """Layer 0's sparse block of a tiny transformers model of `family`."""
    if family == "qwen3_5_moe":
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe

        block = modeling_qwen3_5_moe.Qwen3_5MoeSparseMoeBlock(tiny_qwen35_moe_config()).eval()
        peaked_weights(block, 0)
        return block
    return moe_model(family).model.layers[0].mlp


def ours_like(block: torch.nn.Module) -> SparseMoE:
    """Our block with `block`'s router and experts (transformers 5 keeps them fused)."""
    experts = block.experts
    num_experts, double, hidden = experts.gate_up_proj.shape
    router = block.gate
    normalize = getattr(router, "norm_topk_prob", True)  # Mixtral's always normalises
    shared = getattr(block, "shared_expert", None)
    ours = SparseMoE(hidden, double // 2, num_experts, router.top_k, normalize,
                     torch.float32, "cpu",
                     shared_expert_size=shared.intermediate_size if shared else 0)
    with torch.no_grad():
        ours.gate.weight.copy_(router.weight)
        if shared is not None:
            mine = ours.shared_expert
            mine.gate_up_proj.slot(0).copy_(shared.gate_proj.weight)
            mine.gate_up_proj.slot(1).copy_(shared.up_proj.weight)
            mine.down_proj.slot(0).copy_(shared.down_proj.weight)
            ours.shared_expert_gate.slot(0).copy_(block.shared_expert_gate.weight)
            for linear in (mine.gate_up_proj, mine.down_proj, ours.shared_expert_gate):
                linear.prepare()
        for e, expert in enumerate(ours.experts):
            expert.gate_up_proj.slot(None).copy_(experts.gate_up_proj[e])
            expert.down_proj.slot(0).copy_(experts.down_proj[e])
            expert.gate_up_proj.prepare()
            expert.down_proj.prepare()
    return ours


def tokens(count: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(count, HIDDEN, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
def test_router_matches_transformers_with_tied_scores(family):
    block = hf_block(family)
    with torch.no_grad():
        # Experts 1, 4 and 6 score alike for every token: the top k must break the ties
        # as transformers does.
        block.gate.weight[4] = block.gate.weight[1]
        block.gate.weight[6] = block.gate.weight[1]
        block.gate.weight[1] *= 3.0
        block.gate.weight[4] *= 3.0
        block.gate.weight[6] *= 3.0
    ours = ours_like(block)
    x = tokens(40)
    with torch.no_grad():
        _, hf_weights, hf_ids = block.gate(x)
    weights, ids = ours.gate(x)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, atol=1e-6, rtol=0)
    # The ties really happened: two of the equal experts won some token.
    assert ((ids == 1) | (ids == 4) | (ids == 6)).sum(1).eq(2).any()


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
def test_sparse_block_matches_transformers(family):
    block = hf_block(family)
    ours = ours_like(block)
    x = tokens(33, seed=1)
    with torch.no_grad():
        expected = block(x.unsqueeze(0))[0]
    torch.testing.assert_close(ours(x), expected, atol=1e-5, rtol=0)
    if family == "qwen3_5_moe":  # the shared expert counts, its gate per token
        routed = ours.mix(x, *ours.gate(x))
        assert (expected - routed).abs().max() > 0.1


def test_a_negative_shared_expert_size_is_refused_by_name():
    with pytest.raises(ValueError, match="shared_expert_intermediate_size"):
        SparseMoE(HIDDEN, 32, 8, 2, True, torch.float32, "cpu", shared_expert_size=-1)


def test_normalize_off_keeps_the_raw_probabilities():
    router = TopKRouter(HIDDEN, 8, 2, False, torch.float32, "cpu")
    torch.nn.init.normal_(router.weight)
    x = tokens(5)
    weights, ids = router(x)
    probs = torch.softmax(x @ router.weight.T, -1)
    torch.testing.assert_close(weights, probs.gather(1, ids))
    assert (weights.sum(1) < 1).all()


def test_router_rejects_a_top_k_past_the_experts():
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        TopKRouter(HIDDEN, 4, 5, True, torch.float32, "cpu")


def per_token(block: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """The oracle: every token alone, each of its experts one after the other."""
    weights, ids = block.gate(x)
    rows = []
    for t in range(x.shape[0]):
        row = torch.zeros(x.shape[1])
        for w, e in zip(weights[t], ids[t].tolist(), strict=True):
            row += w * block.experts[e](x[t:t + 1])[0]
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("count", [1, 3, 64])
def test_grouped_step_equals_a_per_token_loop(count):
    ours = ours_like(hf_block("qwen3_moe"))
    x = tokens(count, seed=2)
    torch.testing.assert_close(ours(x), per_token(ours, x), atol=1e-5, rtol=0)


def quantized_block(name: str) -> SparseMoE:
    """A block whose experts hold GGUF blocks (K = 256, one K-quant block per row)."""
    hidden, size = 256, 256
    block = SparseMoE(hidden, size, 4, 2, True, torch.float32, "cpu")
    torch.nn.init.normal_(block.gate.weight)
    for e, expert in enumerate(block.experts):
        for linear, rows, seed in ((expert.gate_up_proj, 2 * size, 2 * e),
                                   (expert.down_proj, hidden, 2 * e + 1)):
            fmt, blocks = random_quantized(name, rows, 256, seed=seed)
            linear.slot(None).copy_(QuantizedTensor(fmt.type_id, (rows, 256),
                                                    torch.from_numpy(blocks)))
            linear.prepare()
        assert expert.gate_up_proj.quantized
    block.prepare()
    if kernels.cpu.available():  # the grouped native calls, not the loop
        assert block.native is not None
    return block


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "Q6_K"])
def test_grouped_prefill_on_quantized_experts_equals_a_per_token_loop(name):
    block = quantized_block(name)
    x = torch.randn(24, 256, generator=torch.Generator().manual_seed(3))
    grouped, loop = block(x), per_token(block, x)
    # Each expert's batch of rows takes the prefill tiles, a lone row the decode GEMV:
    # two roundings of the activations, so close rather than equal.
    rel = (grouped - loop).norm() / loop.norm()
    assert rel < 2e-3


def test_a_decode_token_on_quantized_experts_equals_its_experts_one_by_one():
    # The native path's lone token: every expert's gate/up in one call, then each down.
    block = quantized_block("Q4_K")
    for seed in range(4):
        x = torch.randn(1, 256, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(block(x), per_token(block, x), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not kernels.cpu.available(), reason="the activation bits choose the "
                    "native library's decode rows; the PyTorch path has no such choice")
@pytest.mark.parametrize("bits", [8, 16])
def test_the_grouped_step_takes_the_activation_bits_it_is_given(bits):
    from engine.layers.weights import set_activation_bits

    block = quantized_block("Q4_K")
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(7))
    precise = block(x)
    set_activation_bits(block, bits)
    # Each expert's products then take single 8-bit rows (or stay pairs), grouped or alone.
    torch.testing.assert_close(block(x), per_token(block, x), atol=1e-5, rtol=1e-5)
    assert torch.equal(block(x), precise) == (bits == 16)


def test_a_step_reads_only_the_routed_experts():
    ours = ours_like(hf_block("olmoe"))
    x = tokens(1, seed=4)
    expected = ours(x)
    _, ids = ours.gate(x)
    with torch.no_grad():
        for e, expert in enumerate(ours.experts):
            if e not in ids.tolist()[0]:
                expert.gate_up_proj.slot(None).copy_(torch.full((2 * 48, HIDDEN), float("nan")))
                expert.gate_up_proj.prepare()
    torch.testing.assert_close(ours(x), expected, atol=0, rtol=0)


def test_quantized_experts_match_their_dequantized_floats():
    block = quantized_block("Q4_K")
    dense = SparseMoE(256, 256, 4, 2, True, torch.float32, "cpu")
    with torch.no_grad():
        dense.gate.weight.copy_(block.gate.weight)
        for ours, theirs in zip(dense.experts, block.experts, strict=True):
            for a, b in ((ours.gate_up_proj, theirs.gate_up_proj),
                         (ours.down_proj, theirs.down_proj)):
                a.slot(None).copy_(b.dense_weight())
                a.prepare()
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(5))
    rel = (block(x) - dense(x)).norm() / dense(x).norm()
    # The native kernels keep ~15 bits of each activation; without the library, Q4_K goes
    # to PyTorch's int4 matmul on bfloat16 activations (8 bits of mantissa, 2^-8 each).
    assert rel < (2e-3 if kernels.cpu.available() else 2.0 ** -7)
    assert block.expert_bytes() < dense.expert_bytes() / 5


def test_a_decode_token_on_biased_mxfp4_experts_equals_its_experts_one_by_one():
    # gpt-oss: biased gate/up and down, MXFP4 blocks (the native kernel where built).
    from engine.models import build_model
    from tests.engine.tiny_moe import GPT_OSS, moe_config
    from tests.kernels.mxfp4_cases import MXFP4, random_mxfp4

    model = build_model(moe_config(GPT_OSS, num_hidden_layers=1), torch.float32, "cpu")
    gen = torch.Generator().manual_seed(6)
    weights = []
    for i, (name, target) in enumerate(model.checkpoint_targets().items()):
        if ".experts." in name and name.endswith("_proj.weight"):
            n, k = target.shape
            blocks = torch.from_numpy(random_mxfp4(n, k, seed=i, exponents=(124, 127)))
            weights.append((name, QuantizedTensor(MXFP4, (n, k), blocks)))
        else:
            weights.append((name, torch.randn(tuple(target.shape), generator=gen) * 0.3))
    model.load_weights(weights)
    block = model.layers[0].mlp
    from engine.layers.weights import NativeQuantized
    if kernels.cpu.available():  # the lone token's one call, biases added after it
        assert isinstance(block.experts[0].gate_up_proj.storage, NativeQuantized)
    for seed in range(4):
        x = torch.randn(1, 64, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(block(x), per_token(block, x), atol=1e-5, rtol=1e-5)
