"""Shared test helpers: tiny random-weight models of every supported family, and paged
attention metadata built by hand.

Tiny models (seconds to build, nothing downloaded):

- Families (the params of the `tiny_family` fixture): "llama" (SmolLM-like, tied
  embeddings), "llama3_rope" (rope_scaling llama3), "llama_linear_rope" (rope_scaling
  linear), "mistral", "mistral_window" (a 16-token window on every layer), "qwen2" (q/k/v
  bias, tied), "qwen3" (q/k RMSNorm, head_dim 32 !=
  hidden / heads), "gemma2" (sliding window 16 every other layer, soft-caps), "gemma3"
  (q/k norms, a rope per layer kind, window 16).
- `tiny_hf_config(family, **overrides)`: the transformers config (hidden 64, 2 layers, 4 query
  heads / 2 KV heads, vocab 256, max_position_embeddings 512, eager attention, no EOS).
- `tiny_hf_model(family, seed=0, **overrides)`: a seeded transformers model, fp32, eval mode,
  with weights large enough that logits are peaked (greedy decoding is then not decided
  by float noise between implementations).
- `load_into_ours(hf_model, dtype=torch.float32)`: our model (engine.models.build_model)
  loaded from that model's state_dict through load_weights.

Paged metadata:

- `shuffled_block_tables(block_counts, num_blocks, generator)`: per-sequence lists of
  distinct physical block ids drawn from a shuffled pool.
- `build_attention_metadata(block_tables, cached_lens, q_lens, block_size)`: the
  AttentionMetadata of one step in which sequence i has cached_lens[i] tokens in the cache
  and q_lens[i] new ones (slot mapping included).

Each helper is a session-scoped fixture of the same name that returns the function (test
modules cannot import this file: other conftest.py files share its module name), so a
test asks for it as an argument: `def test_x(tiny_hf_model, load_into_ours): ...`.
`tiny_family` (session scope) runs a test, or a module-scoped fixture, once per family.
`single_torch_thread` runs a test on one torch thread: tiny-tensor tests are 5-7x faster
that way on the shared 2-core machine, where two intra-op threads spin against the other
processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

# Without a GPU the Triton kernels run in Triton's interpreter; with one, compiled. This
# must be settled before anything imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import transformers  # noqa: E402  (after the environment above)

from kernels import AttentionMetadata

TINY_FAMILIES = ("llama", "llama3_rope", "llama_linear_rope", "mistral", "mistral_window",
                 "qwen2", "qwen3", "gemma2", "gemma3")

_COMMON: dict[str, Any] = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, pad_token_id=None,
)
_FAMILY_FIELDS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=True, rope_theta=100000.0)),
    "llama3_rope": ("LlamaConfig", dict(
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    )),
    "llama_linear_rope": ("LlamaConfig", dict(
        rope_theta=10000.0, rope_scaling={"rope_type": "linear", "factor": 4.0},
    )),
    "mistral": ("MistralConfig", dict(rope_theta=1000000.0, sliding_window=4096)),
    # Mistral v0.1: every layer attends to the last 16 tokens only.
    "mistral_window": ("MistralConfig", dict(rope_theta=10000.0, sliding_window=16)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True, rope_theta=1000000.0)),
    "qwen3": ("Qwen3Config", dict(head_dim=32, rope_theta=1000000.0)),
    # A window of 16 tokens, so prompts cross it; caps low enough that they bite.
    "gemma2": ("Gemma2Config", dict(
        head_dim=16, query_pre_attn_scalar=24, sliding_window=16, attn_logit_softcapping=3.0,
        final_logit_softcapping=8.0, rope_theta=10000.0,
        layer_types=["sliding_attention", "full_attention"])),
    "gemma3": ("Gemma3TextConfig", dict(
        head_dim=32, query_pre_attn_scalar=32, sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        rope_scaling={"rope_type": "linear", "factor": 4.0})),
}
_MODEL_CLASSES = {
    "LlamaConfig": "LlamaForCausalLM",
    "MistralConfig": "MistralForCausalLM",
    "Qwen2Config": "Qwen2ForCausalLM",
    "Qwen3Config": "Qwen3ForCausalLM",
    "Gemma2Config": "Gemma2ForCausalLM",
    "Gemma3TextConfig": "Gemma3ForCausalLM",
}


def tiny_hf_config(family: str, **overrides: Any) -> transformers.PretrainedConfig:
    if family not in _FAMILY_FIELDS:
        raise ValueError(f"family must be one of {TINY_FAMILIES}, got {family!r}")
    config_class, fields = _FAMILY_FIELDS[family]
    kwargs = {**_COMMON, **fields, **overrides}
    config = getattr(transformers, config_class)(**kwargs)
    config.architectures = [_MODEL_CLASSES[config_class]]
    config._attn_implementation = "eager"
    return config


def tiny_hf_model(family: str, seed: int = 0, **overrides: Any) -> transformers.PreTrainedModel:
    config = tiny_hf_config(family, **overrides)
    model_class = getattr(transformers, config.architectures[0])
    torch.manual_seed(seed)
    model = model_class(config).eval()
    from tests.engine.tiny_models import peaked_weights

    peaked_weights(model, seed)
    return model


def load_into_ours(hf_model: transformers.PreTrainedModel,
                   dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from engine.models import build_model

    model = build_model(hf_model.config, dtype=dtype, device="cpu")
    model.load_weights(hf_model.state_dict().items())
    return model


def shuffled_block_tables(block_counts: Sequence[int], num_blocks: int,
                          generator: torch.Generator) -> list[list[int]]:
    if sum(block_counts) > num_blocks:
        raise ValueError(f"need {sum(block_counts)} blocks, pool has {num_blocks}")
    pool = torch.randperm(num_blocks, generator=generator).tolist()
    tables = []
    for count in block_counts:
        tables.append(pool[:count])
        pool = pool[count:]
    return tables


def build_attention_metadata(block_tables: Sequence[Sequence[int]], cached_lens: Sequence[int],
                             q_lens: Sequence[int], block_size: int) -> AttentionMetadata:
    """Sequence i's new tokens sit at positions cached_lens[i] .. cached_lens[i] + q_lens[i] - 1
    and are written to the slots its block table gives for those positions."""
    seq_lens = [c + q for c, q in zip(cached_lens, q_lens, strict=True)]
    for i, (table, length) in enumerate(zip(block_tables, seq_lens, strict=True)):
        if len(table) * block_size < length:
            raise ValueError(f"sequence {i}: {len(table)} blocks cannot hold {length} tokens")
    width = max(len(t) for t in block_tables)
    tables = torch.zeros((len(block_tables), width), dtype=torch.int32)
    slots: list[int] = []
    for i, table in enumerate(block_tables):
        tables[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
        for pos in range(cached_lens[i], seq_lens[i]):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
    query_start_loc = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.tensor(list(q_lens), dtype=torch.int32).cumsum(0)
    return AttentionMetadata(
        query_start_loc=query_start_loc,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=tables,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
    )


@pytest.fixture(autouse=True)
def _kv_disk_tier_folder(tmp_path_factory, monkeypatch):
    """Each test's own folder for the KV cache's disk tier (on by the app's default
    settings): no test finds another's, or a real user's, blocks."""
    monkeypatch.setenv("FOLIO_KV_CACHE_DIR", str(tmp_path_factory.mktemp("kv-disk")))
    # Extracted documents too (engine/documents/store.py).
    monkeypatch.setenv("FOLIO_DOCUMENTS_DIR", str(tmp_path_factory.mktemp("documents")))


@pytest.fixture
def single_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def without_native_cpu(monkeypatch):
    """The CPU path as it runs where the native library is not built: PyTorch's
    weight-only ops (kernels.cpu.available() answers False)."""
    import kernels.cpu

    monkeypatch.setattr(kernels.cpu, "available", lambda: False)


@pytest.fixture(scope="session", params=TINY_FAMILIES)
def tiny_family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session", name="tiny_hf_config")
def _tiny_hf_config_fixture() -> Callable[..., transformers.PretrainedConfig]:
    return tiny_hf_config


@pytest.fixture(scope="session", name="tiny_hf_model")
def _tiny_hf_model_fixture() -> Callable[..., transformers.PreTrainedModel]:
    return tiny_hf_model


@pytest.fixture(scope="session", name="load_into_ours")
def _load_into_ours_fixture() -> Callable[..., torch.nn.Module]:
    return load_into_ours


@pytest.fixture(scope="session", name="build_attention_metadata")
def _build_attention_metadata_fixture() -> Callable[..., AttentionMetadata]:
    return build_attention_metadata


@pytest.fixture(scope="session", name="shuffled_block_tables")
def _shuffled_block_tables_fixture() -> Callable[..., list[list[int]]]:
    return shuffled_block_tables
