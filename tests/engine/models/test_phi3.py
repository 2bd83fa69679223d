"""Phi-3 / Phi-4-mini against transformers' Phi3ForCausalLM, driven through the paged KV
cache like the engine (test_llama.py's PagedHarness): chunked prefill, decode steps, mixed
batches, shared prefix blocks, greedy generation; and the fused checkpoint's loading.

LongRoPE picks short or long factors per forward in transformers (by the largest position
+ 1) and per sequence of a step here, so for the LongRoPE variants the reference replays
each sequence's steps as transformers forwards over a DynamicCache; for the others every
chunking gives the same logits and the reference is one forward over the whole sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import transformers

from engine.models import build_model, checkpoint_shapes
from engine.models.phi3 import Phi3ForCausalLM, phi3_spec
from engine.models.registry import family_of
from engine.models.spec import FamilyTraits
from tests.engine.models.test_llama import PagedHarness, hf_logits, random_tokens
from tests.engine.tiny_models import peaked_weights

pytestmark = pytest.mark.usefixtures("single_torch_thread")

ATOL = 1e-4
ORIGINAL = 32  # LongRoPE variants: sequences longer than this switch to the long factors

_COMMON: dict[str, Any] = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    rope_theta=10000.0,
)


def _longrope(rotary_dim: int) -> dict[str, Any]:
    pairs = rotary_dim // 2
    return dict(original_max_position_embeddings=ORIGINAL, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.1 * i for i in range(pairs)],
        "long_factor": [1.0 + 4.0 * i for i in range(pairs)]})


VARIANTS: dict[str, dict[str, Any]] = {
    # Phi-3-mini-4k: full rotary, plain rope, untied LM head.
    "phi3_mini": {},
    # Phi-3-mini-4k's sliding window (2047 there), small enough that prompts cross it.
    "phi3_window": dict(sliding_window=16),
    # Phi-4-mini: 12 of 16 head dims rotate, tied embeddings.
    "phi4_mini": dict(partial_rotary_factor=0.75, tie_word_embeddings=True),
    # Phi-3-mini-128k: LongRoPE over the full head.
    "phi3_longrope": _longrope(16),
    # Phi-4-mini as shipped: partial rotary, LongRoPE and tied embeddings together.
    "phi4_longrope": dict(partial_rotary_factor=0.75, tie_word_embeddings=True,
                          **_longrope(12)),
}
LONGROPE = ("phi3_longrope", "phi4_longrope")


def phi3_config(variant: str, **overrides: Any) -> transformers.Phi3Config:
    config = transformers.Phi3Config(**{**_COMMON, **VARIANTS[variant], **overrides})
    config.architectures = ["Phi3ForCausalLM"]
    config._attn_implementation = "eager"
    return config


def phi3_hf_model(variant: str, seed: int = 0, **overrides: Any) -> transformers.Phi3ForCausalLM:
    """A seeded model with weights large enough that logits are peaked (as conftest's
    tiny_hf_model), so greedy decoding is not decided by float noise."""
    torch.manual_seed(seed)
    model = transformers.Phi3ForCausalLM(phi3_config(variant, **overrides)).eval()
    peaked_weights(model, seed)
    return model


def ours_from(hf_model: transformers.PreTrainedModel,
              dtype: torch.dtype = torch.float32) -> Phi3ForCausalLM:
    spec = phi3_spec(hf_model.config, "Phi3ForCausalLM", FamilyTraits())
    model = Phi3ForCausalLM(spec, dtype, "cpu")
    model.load_weights(hf_model.state_dict().items())
    return model


def hf_stepwise_logits(hf_model: transformers.PreTrainedModel, tokens: list[int],
                       steps: list[int]) -> torch.Tensor:
    """transformers run the way the engine ran one sequence: one forward per step (steps =
    its chunk lengths) over a DynamicCache, so LongRoPE chooses per step as ours does."""
    assert sum(steps) == len(tokens)
    cache = transformers.DynamicCache(config=hf_model.config)
    logits, start = [], 0
    with torch.no_grad():
        for count in steps:
            ids = torch.tensor([tokens[start:start + count]])
            positions = torch.arange(start, start + count).unsqueeze(0)
            out = hf_model(ids, position_ids=positions, cache=cache, use_cache=True)
            logits.append(out.logits[0].float())
            start += count
    return torch.cat(logits)


def hf_greedy(hf_model: transformers.PreTrainedModel, prompt: list[int],
              count: int) -> list[int]:
    """Greedy decoding over a cache that is never dropped (generate() drops it once, when a
    LongRoPE sequence first outgrows original_max_position_embeddings)."""
    tokens = list(prompt)
    steps = [len(prompt)]
    for _ in range(count):
        tokens.append(int(hf_stepwise_logits(hf_model, tokens, steps)[-1].argmax()))
        steps.append(1)
    return tokens[len(prompt):]


class Recorder:
    """A PagedHarness that remembers each sequence's chunk lengths."""

    def __init__(self, harness: PagedHarness) -> None:
        self.harness = harness
        self.steps: dict[str, list[int]] = {}

    def step(self, chunks: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        for seq, tokens in chunks:
            self.steps.setdefault(seq, []).append(len(tokens))
        return self.harness.step(chunks)


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def models(variant):
    hf_model = phi3_hf_model(variant)
    return hf_model, ours_from(hf_model)


@pytest.fixture
def make_harness(build_attention_metadata) -> Callable[..., Recorder]:
    def make(model: torch.nn.Module, seed: int = 0, head_major: bool = False) -> Recorder:
        return Recorder(PagedHarness(model, build_attention_metadata, seed=seed,
                                     head_major=head_major))
    return make


def expected_logits(variant: str, hf_model: transformers.PreTrainedModel, tokens: list[int],
                    steps: list[int]) -> torch.Tensor:
    if variant in LONGROPE:
        return hf_stepwise_logits(hf_model, tokens, steps)
    return hf_logits(hf_model, tokens)


@pytest.mark.parametrize("head_major", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 16, 33])
def test_chunked_prefill_then_decode_matches_transformers(variant, models, make_harness, chunk,
                                                          head_major):
    hf_model, ours = models
    harness = make_harness(ours, seed=chunk, head_major=head_major)
    prompt = random_tokens(41, seed=1)
    logits = []
    for start in range(0, len(prompt), chunk):
        logits += harness.step([("a", prompt[start:start + chunk])])
    tokens = list(prompt)
    for _ in range(16):  # 57 tokens: LongRoPE variants cross from short to long factors
        tokens.append(int(logits[-1][-1].argmax()))
        logits += harness.step([("a", tokens[-1:])])
    ours_all = torch.cat(logits)
    assert ours_all.shape == (41 + 16, 256)
    expected = expected_logits(variant, hf_model, tokens, harness.steps["a"])
    torch.testing.assert_close(ours_all, expected, atol=ATOL, rtol=0)


def test_mixed_batch_of_prefill_chunks_and_decodes_matches_transformers(variant, models,
                                                                        make_harness):
    hf_model, ours = models
    harness = make_harness(ours, seed=3)
    # b and c stay within 32 tokens for a while (short factors) while a crosses.
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
    for _ in range(12):  # b crosses 32 tokens here, in a batch with a (long), c (short)
        run([(seq, next_token(seq)) for seq in ("a", "b", "c")])
    assert len(tokens["b"]) > ORIGINAL >= len(tokens["c"])
    for seq in prompts:
        ours_all = torch.cat(logits[seq])
        assert ours_all.shape[0] == len(tokens[seq])
        expected = expected_logits(variant, hf_model, tokens[seq], harness.steps[seq])
        torch.testing.assert_close(ours_all, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize(("first_len", "shared_blocks", "total_len"), [(40, 2, 43), (24, 1, 50)])
def test_prefill_reusing_shared_prefix_blocks_matches_transformers(variant, models, make_harness,
                                                                   first_len, shared_blocks,
                                                                   total_len):
    hf_model, ours = models
    harness = make_harness(ours, seed=5)
    first = random_tokens(first_len, 6)
    harness.step([("a", first)])
    shared = shared_blocks * 16
    second = first[:shared] + random_tokens(total_len - shared, 7)
    harness.harness.share_prefix("a", "b", num_blocks=shared_blocks)
    (suffix_logits,) = harness.step([("b", second[shared:])])
    tables = harness.harness.tables
    assert tables["b"][:shared_blocks] == tables["a"][:shared_blocks]
    if variant in LONGROPE:
        # The shared keys were rotated in a's step: long factors for (40, 2, 43), short for
        # (24, 1, 50), whose b ends long. transformers does the same from a's cache.
        expected = hf_logits_after_prefix(hf_model, first, shared, second)
    else:
        expected = hf_logits(hf_model, second)[shared:]
    torch.testing.assert_close(suffix_logits, expected, atol=ATOL, rtol=0)


def hf_logits_after_prefix(hf_model: transformers.PreTrainedModel, first: list[int],
                           shared: int, second: list[int]) -> torch.Tensor:
    """second[shared:]'s logits over the cache of one forward over ``first``, cut to its
    first ``shared`` tokens (which ``second`` starts with)."""
    cache = transformers.DynamicCache(config=hf_model.config)
    with torch.no_grad():
        hf_model(torch.tensor([first]), cache=cache, use_cache=True)
        cache.crop(shared - len(first))  # a negative count: tokens to drop
        positions = torch.arange(shared, len(second)).unsqueeze(0)
        out = hf_model(torch.tensor([second[shared:]]), position_ids=positions, cache=cache,
                       use_cache=True)
    return out.logits[0].float()


def test_greedy_generation_matches_transformers(variant, models, make_harness):
    hf_model, ours = models
    prompt = random_tokens(23, 8)
    if variant in LONGROPE:  # crosses 32 tokens while decoding
        expected = hf_greedy(hf_model, prompt, 40)
    else:
        with torch.no_grad():
            expected = hf_model.generate(
                torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None,
                pad_token_id=0)[0, len(prompt):].tolist()
    harness = make_harness(ours, seed=9)
    (logits,) = harness.step([("a", prompt)])
    generated = []
    for _ in range(40):
        generated.append(int(logits[-1].argmax()))
        (logits,) = harness.step([("a", generated[-1:])])
    assert generated == expected


@pytest.mark.parametrize("variant_name", LONGROPE)
def test_longrope_prompt_past_the_original_length_matches_generate(variant_name, make_harness):
    # A prompt already longer than original_max_position_embeddings: transformers' first
    # forward uses the long factors for every position, and generate() keeps its cache.
    hf_model = phi3_hf_model(variant_name)
    ours = ours_from(hf_model)
    prompt = random_tokens(40, 12)
    with torch.no_grad():
        expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)[0, len(prompt):]
    harness = make_harness(ours, seed=13)
    (logits,) = harness.step([("a", prompt)])
    torch.testing.assert_close(logits, hf_logits(hf_model, prompt), atol=ATOL, rtol=0)
    generated = []
    for _ in range(40):
        generated.append(int(logits[-1].argmax()))
        (logits,) = harness.step([("a", generated[-1:])])
    assert generated == expected.tolist()


@pytest.mark.parametrize("variant_name", LONGROPE)
def test_longrope_short_sequence_uses_the_short_factors(variant_name, make_harness):
    # 20 + 12 = 32 tokens: never past the original length, so one forward over the whole
    # sequence (short factors throughout) is the reference; a chunked run agrees.
    hf_model = phi3_hf_model(variant_name)
    ours = ours_from(hf_model)
    harness = make_harness(ours, seed=14)
    tokens = random_tokens(20, 15)
    logits = harness.step([("a", tokens[:7])]) + harness.step([("a", tokens[7:])])
    for _ in range(12):
        tokens.append(int(logits[-1][-1].argmax()))
        logits += harness.step([("a", tokens[-1:])])
    assert len(tokens) == ORIGINAL
    torch.testing.assert_close(torch.cat(logits), hf_logits(hf_model, tokens), atol=ATOL, rtol=0)


def test_longrope_crossing_really_switches_factors():
    # The stepwise reference above is not the single-forward one once a sequence crosses:
    # keys of the short steps keep their short rotation.
    hf_model = phi3_hf_model("phi4_longrope")
    tokens = random_tokens(57, 16)
    stepwise = hf_stepwise_logits(hf_model, tokens, [16, 16, 16, 9])
    whole = hf_logits(hf_model, tokens)
    torch.testing.assert_close(stepwise[:32], hf_logits(hf_model, tokens[:32]), atol=ATOL,
                               rtol=0)
    assert (stepwise[32:] - whole[32:]).abs().max() > 1e-2


def test_bfloat16_model_tracks_float32_logits(make_harness):
    hf_model = phi3_hf_model("phi4_longrope")
    ours = ours_from(hf_model, dtype=torch.bfloat16)
    harness = make_harness(ours)
    prompt = random_tokens(40, 10)
    (logits,) = harness.step([("a", prompt)])
    expected = hf_logits(hf_model, prompt)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected, atol=0.5, rtol=0.05)
    assert (logits.argmax(-1) == expected.argmax(-1)).float().mean().item() >= 0.9


# --- the fused checkpoint ------------------------------------------------------------------

def test_fused_checkpoint_names_and_shapes_match_transformers(variant):
    hf_model = phi3_hf_model(variant)
    spec = phi3_spec(hf_model.config, "Phi3ForCausalLM", FamilyTraits())
    targets = Phi3ForCausalLM(spec, torch.float32, "meta").checkpoint_targets()
    expected = {name: tuple(t.shape) for name, t in hf_model.state_dict().items()}
    if spec.tie_word_embeddings:
        del expected["lm_head.weight"]
    assert {name: tuple(t.shape) for name, t in targets.items()} == expected
    assert targets["model.layers.0.self_attn.qkv_proj.weight"].shape == (4 * 16 + 2 * 2 * 16, 64)
    assert targets["model.layers.0.mlp.gate_up_proj.weight"].shape == (2 * 128, 64)


def test_fused_matrices_load_whole_into_the_stacked_layers():
    hf_model = phi3_hf_model("phi4_mini")
    ours = ours_from(hf_model)
    hf_layer, layer = hf_model.model.layers[1], ours.layers[1]
    assert torch.equal(layer.self_attn.qkv_proj.dense_weight(),
                       hf_layer.self_attn.qkv_proj.weight)
    assert torch.equal(layer.mlp.gate_up_proj.dense_weight(), hf_layer.mlp.gate_up_proj.weight)
    assert layer.self_attn.qkv_proj.bias is None and layer.mlp.down_proj.bias is None
    assert ours.lm_head.weight is ours.embed_tokens.weight


def test_a_loaded_model_loads_new_weights_again():
    # The fused targets are the whole (possibly packed) matrices: a second load must reach
    # the plain ones again.
    first, second = phi3_hf_model("phi3_mini", seed=1), phi3_hf_model("phi3_mini", seed=2)
    ours = ours_from(first)
    ours.load_weights(second.state_dict().items())
    assert torch.equal(ours.layers[0].self_attn.qkv_proj.dense_weight(),
                       second.model.layers[0].self_attn.qkv_proj.weight)
    assert torch.equal(ours.layers[1].mlp.gate_up_proj.dense_weight(),
                       second.model.layers[1].mlp.gate_up_proj.weight)


def test_wrong_fused_shape_is_a_value_error_naming_the_tensor():
    hf_model = phi3_hf_model("phi3_mini")
    state = dict(hf_model.state_dict())
    state["model.layers.1.self_attn.qkv_proj.weight"] = torch.zeros(96, 64)
    ours = Phi3ForCausalLM(phi3_spec(hf_model.config, "Phi3ForCausalLM", FamilyTraits()),
                           torch.float32, "cpu")
    with pytest.raises(ValueError) as error:
        ours.load_weights(state.items())
    message = str(error.value)
    assert "model.layers.1.self_attn.qkv_proj.weight" in message
    assert "(96, 64)" in message and "(128, 64)" in message


def test_split_llama_names_are_rejected_and_missing_fused_ones_named():
    hf_model = phi3_hf_model("phi3_mini")
    ours = Phi3ForCausalLM(phi3_spec(hf_model.config, "Phi3ForCausalLM", FamilyTraits()),
                           torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"unexpected parameter 'model.layers.0.self_attn.q_proj"):
        ours.load_weights([("model.layers.0.self_attn.q_proj.weight", torch.zeros(64, 64))])
    state = dict(hf_model.state_dict())
    del state["model.layers.0.mlp.gate_up_proj.weight"]
    with pytest.raises(ValueError, match=r"missing 1 parameter\(s\): "
                                         r"model.layers.0.mlp.gate_up_proj.weight"):
        ours.load_weights(state.items())


# --- the spec ------------------------------------------------------------------------------

def test_spec_reads_partial_rotary_longrope_and_the_window():
    spec = phi3_spec(phi3_config("phi4_longrope"), "Phi3ForCausalLM", FamilyTraits())
    assert spec.head_dim == 16 and spec.rotary_dim == 12
    assert spec.original_max_position_embeddings == ORIGINAL
    assert spec.long_factor == tuple(1.0 + 4.0 * i for i in range(6))
    # transformers' attention factor: sqrt(1 + ln(512 / 32) / ln(32)).
    assert spec.attention_factor == pytest.approx((1 + 4 / 5) ** 0.5)
    assert not (spec.qkv_bias or spec.o_bias or spec.mlp_bias)
    windowed = phi3_spec(phi3_config("phi3_window"), "Phi3ForCausalLM", FamilyTraits())
    model = Phi3ForCausalLM(windowed, torch.float32, "meta")
    assert model.max_context_len == 512  # the window is applied, not a context cap
    assert all(layer.self_attn.attention_options == {"sliding_window": 16}
               for layer in model.layers)
    # Phi-3-mini-128k / Phi-4-mini carry a window longer than the context: it hides nothing.
    wide = phi3_spec(phi3_config("phi3_mini", sliding_window=262144), "Phi3ForCausalLM",
                     FamilyTraits())
    assert wide.sliding_window is None and wide.max_context_len == 512


def test_spec_takes_the_legacy_longrope_names_and_top_level_original_length():
    # An older config.json: rope_scaling with "type": "su", rope_theta at the top level;
    # original_max_position_embeddings at the top level wins over the dict's.
    factors = [1.0] * 8
    config = SimpleNamespace(
        architectures=["Phi3ForCausalLM"], vocab_size=256, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-5,
        rope_theta=500.0, original_max_position_embeddings=1024, hidden_act="silu",
        rope_scaling={"type": "su", "short_factor": factors, "long_factor": factors,
                      "original_max_position_embeddings": 2048})
    spec = phi3_spec(config, "Phi3ForCausalLM", FamilyTraits())
    assert spec.rope_theta == 500.0 and spec.rotary_dim == 16
    assert spec.original_max_position_embeddings == 1024
    assert spec.attention_factor == pytest.approx((1 + 2 / 10) ** 0.5)


def test_spec_rejects_bad_rope_settings_by_name():
    config = phi3_config("phi3_mini")
    config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="'linear' is not supported for Phi-3"):
        phi3_spec(config, "Phi3ForCausalLM", FamilyTraits())
    config = phi3_config("phi3_longrope")
    config.rope_parameters = {**config.rope_parameters, "long_factor": [1.0] * 3}
    with pytest.raises(ValueError, match="long_factor must list 8 numbers"):
        phi3_spec(config, "Phi3ForCausalLM", FamilyTraits())


def test_registered_as_the_phi3_family():
    config = phi3_config("phi4_longrope")
    family = family_of(config)
    assert (family.architecture, family.model_type) == ("Phi3ForCausalLM", "phi3")
    # llama.cpp keeps Phi-3's fused qkv rows in Hugging Face order (NEOX rope), but Folio's
    # GGUF reader has no phi3 tensor names yet, so no GGUF architecture is claimed.
    assert family.gguf_architectures == ("phi3",) and not family.gguf_rope_permuted
    model = build_model(config, "float32", "meta")
    assert isinstance(model, Phi3ForCausalLM) and model.spec.rotary_dim == 12
    expected = {name: tuple(t.shape) for name, t in phi3_hf_model("phi4_longrope").state_dict()
                .items() if name != "lm_head.weight"}
    assert checkpoint_shapes(config) == expected
    config.architectures = None  # a hand-written config still names its model_type
    assert family_of(config).architecture == "Phi3ForCausalLM"
