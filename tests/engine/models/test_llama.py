"""The Llama-family decoder against transformers, driven through a paged KV cache the way
the engine drives it: shuffled physical blocks, chunked prefill, decode steps, mixed
batches and shared prefix blocks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import transformers

from engine.layers import onednn
from engine.models import SUPPORTED_ARCHITECTURES, build_model
from engine.models.base import pool_layers
from kernels import allocate_kv_cache, get_backend

pytestmark = pytest.mark.usefixtures("single_torch_thread")

BLOCK_SIZE = 16
ATOL = 1e-4


class PagedHarness:
    """A block pool handed out in shuffled order, per-sequence block tables, and one
    forward per step over any mix of prefill chunks and decode tokens.

    head_major: the engine's CPU pool instead (head-major memory order, blocks handed out
    in id order, so each sequence's blocks are consecutive and read in place)."""

    def __init__(self, model: torch.nn.Module, build_metadata: Callable[..., object],
                 num_blocks: int = 40, seed: int = 0, head_major: bool = False) -> None:
        spec = model.spec
        self.model = model
        self.build_metadata = build_metadata
        self.kv_cache = allocate_kv_cache(spec.num_layers, num_blocks, BLOCK_SIZE,
                                          spec.num_kv_heads, spec.head_dim, model.dtype, "cpu",
                                          head_major=head_major)
        if head_major:
            self.free = list(range(num_blocks))[::-1]
        else:
            order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
            self.free = order.tolist()
        self.tables: dict[str, list[int]] = {}
        self.lengths: dict[str, int] = {}
        # The engine's CPU default: the native kernels when built, else the reference.
        self.backend = get_backend("cpu")

    def share_prefix(self, source: str, target: str, num_blocks: int) -> None:
        """target starts with source's first num_blocks (full) blocks, already computed."""
        self.tables[target] = list(self.tables[source][:num_blocks])
        self.lengths[target] = num_blocks * BLOCK_SIZE

    def step(self, chunks: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        """Runs one forward; returns each chunk's float32 logits [len(chunk), vocab]."""
        cached, tables, ids, positions = [], [], [], []
        for seq, tokens in chunks:
            start = self.lengths.get(seq, 0)
            table = self.tables.setdefault(seq, [])
            while len(table) * BLOCK_SIZE < start + len(tokens):
                table.append(self.free.pop())
            cached.append(start)
            tables.append(table)
            ids.extend(tokens)
            positions.extend(range(start, start + len(tokens)))
            self.lengths[seq] = start + len(tokens)
        meta = self.build_metadata(tables, cached, [len(t) for _, t in chunks], BLOCK_SIZE)
        with torch.inference_mode():
            hidden = self.model(torch.tensor(ids), torch.tensor(positions),
                                pool_layers(self.kv_cache, meta), meta,
                                self.backend)
            logits = self.model.compute_logits(hidden)
        return list(logits.split([len(t) for _, t in chunks]))


def hf_logits(hf_model: transformers.PreTrainedModel, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits[0].float()


def random_tokens(count: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def models(tiny_family, tiny_hf_model, load_into_ours):
    hf_model = tiny_hf_model(tiny_family)
    return hf_model, load_into_ours(hf_model)


@pytest.fixture
def make_harness(build_attention_metadata) -> Callable[..., PagedHarness]:
    def make(model: torch.nn.Module, seed: int = 0, head_major: bool = False) -> PagedHarness:
        return PagedHarness(model, build_attention_metadata, seed=seed, head_major=head_major)
    return make


@pytest.mark.parametrize("head_major", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 16, 33])
def test_chunked_prefill_then_decode_matches_transformers(models, make_harness, chunk,
                                                          head_major):
    hf_model, ours = models
    harness = make_harness(ours, seed=chunk, head_major=head_major)
    prompt = random_tokens(41, seed=1)
    logits = []
    for start in range(0, len(prompt), chunk):
        logits += harness.step([("a", prompt[start:start + chunk])])
    tokens = list(prompt)
    for _ in range(16):
        tokens.append(int(logits[-1][-1].argmax()))
        logits += harness.step([("a", tokens[-1:])])
    ours_all = torch.cat(logits)
    assert ours_all.shape == (41 + 16, 256)
    torch.testing.assert_close(ours_all, hf_logits(hf_model, tokens), atol=ATOL, rtol=0)


def test_mixed_batch_of_prefill_chunks_and_decodes_matches_transformers(models, make_harness):
    hf_model, ours = models
    harness = make_harness(ours, seed=3)
    prompts = {"a": random_tokens(40, 2), "b": random_tokens(20, 3), "c": random_tokens(9, 4)}
    tokens = {seq: list(p) for seq, p in prompts.items()}
    logits: dict[str, list[torch.Tensor]] = {seq: [] for seq in prompts}

    def run(chunks: list[tuple[str, list[int]]]) -> None:
        for (seq, _), out in zip(chunks, harness.step(chunks), strict=True):
            logits[seq].append(out)

    def next_token(seq: str) -> list[int]:
        tokens[seq].append(int(logits[seq][-1][-1].argmax()))
        return tokens[seq][-1:]

    run([("b", prompts["b"]), ("c", prompts["c"])])
    for start in range(0, 40, 16):  # a prefills in chunks while b and c decode
        run([("b", next_token("b")), ("a", prompts["a"][start:start + 16]),
             ("c", next_token("c"))])
    for _ in range(3):
        run([(seq, next_token(seq)) for seq in ("a", "b", "c")])
    for seq in prompts:
        ours_all = torch.cat(logits[seq])
        assert ours_all.shape[0] == len(tokens[seq])
        torch.testing.assert_close(ours_all, hf_logits(hf_model, tokens[seq]), atol=ATOL, rtol=0)


def test_prefill_reusing_shared_prefix_blocks_matches_transformers(models, make_harness):
    hf_model, ours = models
    harness = make_harness(ours, seed=5)
    first = random_tokens(40, 6)
    harness.step([("a", first)])
    second = first[:32] + random_tokens(11, 7)
    harness.share_prefix("a", "b", num_blocks=2)
    (suffix_logits,) = harness.step([("b", second[32:])])
    assert harness.tables["b"][:2] == harness.tables["a"][:2]
    torch.testing.assert_close(suffix_logits, hf_logits(hf_model, second)[32:], atol=ATOL, rtol=0)


def test_greedy_generation_matches_transformers_generate(models, make_harness):
    hf_model, ours = models
    prompt = random_tokens(23, 8)
    with torch.no_grad():
        expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)[0, len(prompt):]
    harness = make_harness(ours, seed=9)
    (logits,) = harness.step([("a", prompt)])
    generated = []
    for _ in range(32):
        generated.append(int(logits[-1].argmax()))
        (logits,) = harness.step([("a", generated[-1:])])
    assert generated == expected.tolist()


def test_bfloat16_model_tracks_float32_logits(tiny_hf_model, load_into_ours, make_harness):
    hf_model = tiny_hf_model("llama")
    ours = load_into_ours(hf_model, dtype=torch.bfloat16)
    assert ours.embed_tokens.weight.dtype == torch.bfloat16
    harness = make_harness(ours)
    prompt = random_tokens(30, 10)
    (logits,) = harness.step([("a", prompt)])
    expected = hf_logits(hf_model, prompt)
    assert logits.dtype == torch.float32
    # bf16 keeps 8 bits of mantissa; logits here have a spread of about 8.
    torch.testing.assert_close(logits, expected, atol=0.5, rtol=0.05)
    agree = (logits.argmax(-1) == expected.argmax(-1)).float().mean().item()
    assert agree >= 0.9


def test_qkv_and_gate_up_are_stacked_at_load(tiny_hf_model, load_into_ours):
    hf_model = tiny_hf_model("qwen2")
    ours = load_into_ours(hf_model)
    hf_attn, hf_mlp = hf_model.model.layers[1].self_attn, hf_model.model.layers[1].mlp
    attn, mlp = ours.layers[1].self_attn, ours.layers[1].mlp
    expected_qkv = torch.cat([hf_attn.q_proj.weight, hf_attn.k_proj.weight,
                              hf_attn.v_proj.weight])
    assert torch.equal(attn.qkv_proj.dense_weight(), expected_qkv)
    assert torch.equal(attn.qkv_proj.bias, torch.cat([hf_attn.q_proj.bias, hf_attn.k_proj.bias,
                                                      hf_attn.v_proj.bias]))
    assert attn.o_proj.bias is None
    assert torch.equal(mlp.gate_up_proj.dense_weight(),
                       torch.cat([hf_mlp.gate_proj.weight, hf_mlp.up_proj.weight]))


def test_a_loaded_model_loads_new_weights_again(tiny_hf_model, load_into_ours):
    # Packed layouts (CPU float32) give their plain matrices back for the second load.
    first, second = tiny_hf_model("mistral", seed=1), tiny_hf_model("mistral", seed=2)
    ours = load_into_ours(first)
    ours.load_weights(second.state_dict().items())
    hidden = torch.randn(2, 64, generator=torch.Generator().manual_seed(3))
    expected = hidden @ second.lm_head.weight.detach().t()
    torch.testing.assert_close(ours.compute_logits(hidden), expected, atol=1e-5, rtol=0)
    assert torch.equal(ours.layers[0].mlp.down_proj.dense_weight(),
                       second.model.layers[0].mlp.down_proj.weight)


def test_tied_embeddings_share_one_matrix(tiny_hf_model, load_into_ours):
    ours = load_into_ours(tiny_hf_model("llama"))
    assert ours.lm_head.weight is ours.embed_tokens.weight
    untied = load_into_ours(tiny_hf_model("mistral"))
    assert untied.lm_head.weight is not untied.embed_tokens.weight


def test_unsupported_architecture_names_it_and_the_supported_ones():
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2)
    config.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(ValueError) as error:
        build_model(config, torch.float32, "cpu")
    message = str(error.value)
    assert "GPT2LMHeadModel" in message
    for name in SUPPORTED_ARCHITECTURES:
        assert name in message
    assert SUPPORTED_ARCHITECTURES[:4] == ("LlamaForCausalLM", "MistralForCausalLM",
                                           "Qwen2ForCausalLM", "Qwen3ForCausalLM")
    assert {"Gemma2ForCausalLM", "Gemma3ForCausalLM"} <= set(SUPPORTED_ARCHITECTURES)
    assert {"OlmoeForCausalLM", "Qwen3MoeForCausalLM",
            "MixtralForCausalLM"} <= set(SUPPORTED_ARCHITECTURES)
    assert {"Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"} <= set(SUPPORTED_ARCHITECTURES)


def test_architecture_falls_back_to_model_type(tiny_hf_config):
    config = tiny_hf_config("qwen3")
    config.architectures = None
    model = build_model(config, "float32", "cpu")
    assert model.spec.architecture == "Qwen3ForCausalLM"
    assert model.spec.qk_norm and model.spec.head_dim == 32


def test_shape_mismatch_names_parameter_and_both_shapes(tiny_hf_model):
    hf_model = tiny_hf_model("llama")
    state = dict(hf_model.state_dict())
    state["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(48, 64)
    ours = build_model(hf_model.config, torch.float32, "cpu")
    with pytest.raises(ValueError) as error:
        ours.load_weights(state.items())
    message = str(error.value)
    assert "model.layers.1.self_attn.k_proj.weight" in message
    assert "(48, 64)" in message and "(32, 64)" in message


def test_missing_parameter_is_named(tiny_hf_model):
    hf_model = tiny_hf_model("mistral")
    state = dict(hf_model.state_dict())
    del state["model.layers.0.mlp.up_proj.weight"]
    del state["lm_head.weight"]
    ours = build_model(hf_model.config, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"missing 2 parameter\(s\): lm_head.weight, "
                                         r"model.layers.0.mlp.up_proj.weight"):
        ours.load_weights(state.items())


def test_unexpected_parameter_is_named_and_inv_freq_is_ignored(tiny_hf_model):
    hf_model = tiny_hf_model("llama")
    ours = build_model(hf_model.config, torch.float32, "cpu")
    extra = [("model.layers.0.self_attn.rotary_emb.inv_freq", torch.zeros(8))]
    ours.load_weights(list(hf_model.state_dict().items()) + extra)
    with pytest.raises(ValueError, match=r"unexpected parameter 'model.layers.2.mlp.up_proj"):
        ours.load_weights([("model.layers.2.mlp.up_proj.weight", torch.zeros(128, 64))])


def test_unsupported_rope_type_is_named(tiny_hf_config):
    config = tiny_hf_config("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match="'dynamic' is not supported"):
        build_model(config, torch.float32, "cpu")


def test_a_sliding_window_reaches_attention_and_leaves_the_context_whole(tiny_hf_config):
    mistral = build_model(tiny_hf_config("mistral", sliding_window=128), torch.float32, "cpu")
    assert mistral.max_context_len == 512
    assert all(layer.self_attn.attention_options == {"sliding_window": 128}
               for layer in mistral.layers)
    qwen2 = build_model(tiny_hf_config("qwen2", sliding_window=128), torch.float32, "cpu")
    assert qwen2.max_context_len == 512  # use_sliding_window is off
    assert all(layer.self_attn.attention_options == {} for layer in qwen2.layers)


def test_logits_agree_across_batch_layouts_and_dtypes(tiny_hf_model, load_into_ours):
    ours = load_into_ours(tiny_hf_model("mistral"))
    hidden = torch.randn(3, 64, generator=torch.Generator().manual_seed(11))
    expected = hidden.double() @ ours.lm_head.dense_weight().double().t()
    batched = ours.compute_logits(hidden)
    single = torch.cat([ours.compute_logits(hidden[i:i + 1]) for i in range(3)])
    assert batched.dtype == single.dtype == torch.float32 and batched.is_contiguous()
    torch.testing.assert_close(batched.double(), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(single.double(), expected, atol=1e-5, rtol=0)
    bf16 = load_into_ours(tiny_hf_model("mistral"), dtype=torch.bfloat16)
    assert bf16.compute_logits(hidden.bfloat16()).dtype == torch.float32


def test_weight_bytes_count_each_matrix_once_and_the_tied_lm_heads_packed_copy(
    tiny_hf_model, load_into_ours
):
    # Packed layouts replace their matrix, except the tied LM head's, which the embedding
    # lookup still reads: that one copy is extra.
    for family, tied in (("mistral", False), ("llama", True)):
        hf_model = tiny_hf_model(family)
        params = sum(p.numel() for p in hf_model.parameters())
        lm_head = 256 * 64 if tied and onednn.available() else 0
        assert load_into_ours(hf_model).weight_bytes() == 4 * (params + lm_head)
        assert load_into_ours(hf_model, dtype=torch.bfloat16).weight_bytes() == 2 * params
