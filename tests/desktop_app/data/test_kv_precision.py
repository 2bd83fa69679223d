"""Settings ▸ Engine ▸ KV cache precision's arithmetic: bytes per token per format, the
tokens each holds in the memory for chats, which formats a device is offered."""

from __future__ import annotations

import pytest

from desktop_app.data.engine_settings import EngineSettings
from desktop_app.data.kv_precision import (
    ModelShape,
    bytes_per_token,
    default_format_name,
    describe_format,
    fit,
    fit_text,
    format_name_for,
    precision_choices,
    shape_of_source,
)
from engine.loaders.catalog import model_info, starter_path
from engine.runner.kv_cache import DEFAULT_KV_BUDGET_BYTES

# The starter's shape: 30 layers, 3 KV heads of 64, an 8,192-token context.
STARTER = ModelShape(30, 3, 64, 8192)
# Llama 3.2 1B: 16 layers, 8 KV heads of 64, 131,072 tokens.
ONE_B = ModelShape(16, 8, 64, 131072)
MIB = 1 << 20


def test_bytes_per_token_per_format():
    # 16-bit: 2 x 30 x 3 x 64 x 2; 8-bit: 64 values + a 2-byte scale per head (int8: and
    # a byte of its key block's centers); 4-bit: 32 bytes of nibbles + one 2-byte scale
    # per 64 elements.
    assert bytes_per_token(STARTER, "float16") == 23040
    assert bytes_per_token(STARTER, "int8") == 2 * 30 * 3 * 67 == 12060
    assert bytes_per_token(STARTER, "int4") == 2 * 30 * 3 * 35 == 6300
    assert bytes_per_token(STARTER, "fp8") == 2 * 30 * 3 * 66
    assert bytes_per_token(STARTER, "float32") == 46080
    # The targets on the starter's shape.
    assert bytes_per_token(STARTER, "int8") / bytes_per_token(STARTER, "float16") <= 0.53
    assert bytes_per_token(STARTER, "int4") / bytes_per_token(STARTER, "float16") <= 0.28


def test_the_shape_of_a_model_matches_the_engines_own_estimate():
    info = model_info(starter_path())
    assert shape_of_source("starter") == ModelShape.of(info) == STARTER
    assert bytes_per_token(STARTER, "float16") == info.kv_bytes(1, "float16")
    assert shape_of_source(None) is None
    assert shape_of_source("http://127.0.0.1:8080/v1") is None
    assert shape_of_source("/no/such/model.gguf") is None


def test_a_budget_holds_more_tokens_in_a_smaller_format():
    budget = 512 * MIB
    got = {name: fit(ONE_B, name, budget) for name in ("float16", "int8", "int4")}
    # Whole blocks the budget buys: 512 MiB / (block size x bytes per token), int4's
    # blocks of 32 tokens, the others' of 16.
    for name, f in got.items():
        bs = 32 if name == "int4" else 16
        per_block = bs * bytes_per_token(ONE_B, name)
        assert f.tokens == budget // per_block * bs
        assert f.pool_bytes == f.tokens * f.bytes_per_token <= budget
        assert not f.enough  # a 131,072-token context does not fit in 512 MiB
    assert got["float16"].tokens == 16384
    assert got["int8"].tokens > 1.9 * got["float16"].tokens
    assert got["int4"].tokens > 3.6 * got["float16"].tokens  # 0.273 of float16's bytes


def test_a_budget_holds_at_most_four_contexts():
    f = fit(STARTER, "int4", 4096 * MIB)
    assert f.tokens == 4 * 8192 and f.enough
    assert fit(STARTER, "int4", 30 * MIB).enough is False


def test_automatic_keeps_the_contexts_in_less_memory():
    # The starter: four full contexts fit in 2 GiB in every format, so automatic holds the
    # same tokens and a smaller format takes less memory.
    auto = {name: fit(STARTER, name, None) for name in ("float16", "int8", "int4")}
    assert {f.tokens for f in auto.values()} == {4 * 8192}
    assert auto["int8"].pool_bytes < auto["float16"].pool_bytes / 1.9
    # The 1B shape's 131,072-token context: one context at least, past the 2 GiB cap.
    one = fit(ONE_B, "float16", None)
    assert one.tokens == 131072 and one.pool_bytes > DEFAULT_KV_BUDGET_BYTES
    # int4's 2 GiB holds more than one context: the cap's whole blocks.
    four = fit(ONE_B, "int4", None)
    per_block = 32 * bytes_per_token(ONE_B, "int4")
    assert four.tokens == DEFAULT_KV_BUDGET_BYTES // per_block * 32 > 131072


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        bytes_per_token(STARTER, "q8_0")
    with pytest.raises(ValueError, match="block_size"):
        fit(STARTER, "int8", None, block_size=0)
    with pytest.raises(ValueError, match="budget_bytes"):
        fit(STARTER, "int8", -1)


def test_fp8_is_offered_for_cuda_only_and_16_bit_is_the_default_there():
    assert precision_choices("cpu", cuda=True) == ("auto", "float16", "int8", "int4")
    assert precision_choices("mps", cuda=False) == ("auto", "float16", "int8", "int4")
    assert precision_choices("auto", cuda=False) == ("auto", "float16", "int8", "int4")
    assert precision_choices("auto", cuda=True) == ("auto", "int8", "int4", "fp8")
    assert precision_choices("cuda:1", cuda=True) == ("auto", "int8", "int4", "fp8")


def test_words():
    assert describe_format("int8") == "8-bit (int8)"
    assert describe_format("int4") == "4-bit (int4)"
    assert describe_format("float16") == "16-bit (float16)"
    assert describe_format("bfloat16") == "16-bit (bfloat16)"
    assert describe_format("fp8") == "8-bit float (fp8)"
    assert fit_text(fit(STARTER, "int8", None)) == "32,768 tokens in 377 MiB"
    assert fit_text(fit(ONE_B, "float16", None)) == "131,072 tokens in 4.0 GiB"
    assert fit_text(fit(ONE_B, "float16", 512 * MIB)) == (
        "16,384 tokens in 512 MiB: less than one full context")


def test_the_format_a_config_keeps():
    cpu = EngineSettings(device="cpu").to_engine_config()
    # The CPU's default: float16 today, int8 if the measurements make it the default.
    assert default_format_name(cpu) == format_name_for(cpu) in ("float16", "int8")
    assert format_name_for(EngineSettings(device="cpu", weights="float32",
                                          kv_cache_dtype="float16").to_engine_config()) == \
        "float16"
