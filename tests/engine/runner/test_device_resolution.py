"""resolve_device: device, compute dtype, attention backend and label, with CUDA faked."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.runner.device import (
    cuda_device_names,
    estimate_dtype,
    estimate_kv_dtype,
    resolve_device,
)
from kernels import BACKEND_ENV, cpu

# The CPU's default backend: the native kernels when built, else the reference.
CPU_BACKEND = "cpu" if cpu.available() else "torch"


@pytest.fixture(autouse=True)
def no_backend_override(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)


def fake_cuda(monkeypatch, names=("NVIDIA H200",), bf16=True):
    """torch.cuda as if these cards were present (or none when names is empty)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(names))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: names[i or 0])
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)


def test_auto_picks_the_gpu_in_bfloat16_with_triton(monkeypatch):
    fake_cuda(monkeypatch)
    r = resolve_device(EngineConfig())
    assert r.device == torch.device("cuda", 0)
    assert (r.dtype, r.kv_dtype, r.backend) == (torch.bfloat16, torch.bfloat16, "triton")
    assert r.label == "CUDA 0: NVIDIA H200"


def test_an_older_card_computes_in_float16(monkeypatch):
    fake_cuda(monkeypatch, ("Tesla V100",), bf16=False)
    assert resolve_device(EngineConfig()).dtype == torch.float16


def test_auto_without_cuda_is_the_cpu_in_float32_with_its_backend(monkeypatch):
    fake_cuda(monkeypatch, ())
    r = resolve_device(EngineConfig())
    assert (r.device, r.dtype, r.backend, r.label) == (
        torch.device("cpu"), torch.float32, CPU_BACKEND, "CPU")


def test_an_explicit_cuda_device_by_index(monkeypatch):
    fake_cuda(monkeypatch, ("NVIDIA H200", "NVIDIA L4"))
    r = resolve_device(EngineConfig(device="cuda:1"))
    assert (r.device, r.label) == (torch.device("cuda", 1), "CUDA 1: NVIDIA L4")
    assert cuda_device_names() == ["NVIDIA H200", "NVIDIA L4"]


@pytest.mark.parametrize("names", [("NVIDIA H200",), ()])
def test_a_cuda_device_that_does_not_exist_names_the_field(monkeypatch, names):
    fake_cuda(monkeypatch, names)
    with pytest.raises(ValueError, match=r"^EngineConfig\.device must be a CUDA device"):
        resolve_device(EngineConfig(device="cuda:1"))
    # The model list's estimate does not fail on it: it counts the default device.
    assert estimate_dtype(EngineConfig(device="cuda:1")) == (
        torch.bfloat16 if names else torch.float32)


def test_cpu_chosen_on_a_gpu_machine(monkeypatch):
    fake_cuda(monkeypatch)
    r = resolve_device(EngineConfig(device="cpu"))
    assert (r.device.type, r.dtype, r.backend) == ("cpu", torch.float32, CPU_BACKEND)


def test_dense_weights_set_the_compute_dtype_unless_dtype_does(monkeypatch):
    fake_cuda(monkeypatch)
    assert resolve_device(EngineConfig(weights="float32")).dtype == torch.float32
    assert resolve_device(EngineConfig(device="cpu", weights="bfloat16")).dtype == \
        torch.bfloat16
    assert resolve_device(EngineConfig(device="cpu", dtype="float16")).dtype == torch.float16
    assert resolve_device(EngineConfig(dtype="bfloat16", weights="bfloat16")).dtype == \
        torch.bfloat16
    with pytest.raises(ValueError, match=r"^EngineConfig\.weights must be 'stored' or the "
                                         r"same as dtype"):
        EngineConfig(dtype="bfloat16", weights="float32")


def test_backend_from_the_config_then_the_environment(monkeypatch):
    fake_cuda(monkeypatch)
    assert resolve_device(EngineConfig(attention_backend="torch")).backend == "torch"
    monkeypatch.setenv(BACKEND_ENV, "torch")
    assert resolve_device(EngineConfig()).backend == "torch"
    monkeypatch.setenv(BACKEND_ENV, "cpu")
    assert resolve_device(EngineConfig()).backend == "cpu"
    monkeypatch.setenv(BACKEND_ENV, "cuda")
    with pytest.raises(ValueError, match=BACKEND_ENV):
        resolve_device(EngineConfig())


def test_mps_when_available_runs_the_torch_path(monkeypatch):
    fake_cuda(monkeypatch, ())
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    r = resolve_device(EngineConfig(device="mps"))
    assert (r.device.type, r.dtype, r.backend, r.label) == (
        "mps", torch.float32, "torch", "Apple GPU (MPS)")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^EngineConfig\.device .*MPS is not available"):
        resolve_device(EngineConfig(device="mps"))


def test_the_kv_cache_is_int8_on_the_native_cpu_kernels_and_the_compute_dtype_elsewhere(
        monkeypatch):
    fake_cuda(monkeypatch, ())
    r = resolve_device(EngineConfig())
    native = CPU_BACKEND == "cpu"
    assert (r.kv_dtype, r.block_size) == ((torch.int8, 64) if native else (torch.float32, 16))
    # Blocks named under int8's 64 tokens keep the native kernels' float16 cache.
    small = resolve_device(EngineConfig(block_size=32))
    assert (small.kv_dtype, small.block_size) == (
        (torch.float16, 32) if native else (torch.float32, 32))
    assert resolve_device(EngineConfig(block_size=64)).kv_dtype == r.kv_dtype
    assert resolve_device(EngineConfig(attention_backend="torch")).kv_dtype == torch.float32
    assert resolve_device(EngineConfig(weights="bfloat16")).kv_dtype == torch.bfloat16
    assert resolve_device(EngineConfig(kv_cache_dtype="float32")).kv_dtype == torch.float32
    forced = EngineConfig(attention_backend="torch", kv_cache_dtype="float16")
    assert resolve_device(forced).kv_dtype == torch.float16
    assert estimate_kv_dtype(EngineConfig()) == r.kv_dtype
    assert resolve_device(EngineConfig(kv_cache_dtype="float16")).block_size == 16


def test_the_triton_backend_takes_the_compute_dtype_or_a_quantized_pool(monkeypatch):
    fake_cuda(monkeypatch)
    assert resolve_device(EngineConfig(kv_cache_dtype="bfloat16")).kv_dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"^EngineConfig\.kv_cache_dtype must be the compute "
                                         r"dtype \(bfloat16\) or a quantized format"):
        resolve_device(EngineConfig(kv_cache_dtype="float16"))
    for name, storage in [("int8", torch.int8), ("int4", torch.uint8),
                          ("fp8", torch.float8_e4m3fn)]:
        resolved = resolve_device(EngineConfig(kv_cache_dtype=name))
        assert resolved.kv_dtype == storage and resolved.kv_format.name == name
    # The model list's estimate does not raise: it shows what the choice would take.
    assert estimate_kv_dtype(EngineConfig(kv_cache_dtype="float16")) == torch.float16


@pytest.mark.parametrize("backend", ["torch", CPU_BACKEND])
def test_a_quantized_kv_cache_dtype_resolves_to_its_storage_dtype_on_the_cpu(monkeypatch,
                                                                             backend):
    fake_cuda(monkeypatch, ())
    for name, storage in [("int8", torch.int8), ("int4", torch.uint8),
                          ("fp8", torch.float8_e4m3fn)]:
        config = EngineConfig(kv_cache_dtype=name, attention_backend=backend)
        resolved = resolve_device(config)
        assert (resolved.dtype, resolved.kv_dtype) == (torch.float32, storage)
        assert resolved.kv_format.name == name
        assert estimate_kv_dtype(config) == storage


def test_a_kv_cache_dtype_that_is_no_kv_format_names_the_field():
    for bad in ("q8_0", "int16", "float64"):
        with pytest.raises(ValueError, match=r"^EngineConfig\.kv_cache_dtype must be one of "
                                             r"\('float32', 'bfloat16', 'float16', 'int8', "
                                             r"'fp8', 'int4'\) or None"):
            EngineConfig(kv_cache_dtype=bad)


def test_the_kv_dtype_names_are_the_kv_formats():
    """engine.dtypes keeps the names (so that validating a setting imports no torch);
    kernels/kv_format.py defines them."""
    from engine.dtypes import KV_DTYPE_NAMES
    from kernels.kv_format import KV_FORMAT_NAMES

    assert KV_DTYPE_NAMES == KV_FORMAT_NAMES
