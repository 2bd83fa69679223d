"""Which device, compute dtype and attention backend an EngineConfig runs on.

`resolve_device(config)` is the one place these are decided; the engine, the memory panel's
label and the model list's memory estimate all read its answer.

Rules:

- **device**: None -> ``cuda`` (device 0) when ``torch.cuda.is_available()``, else ``cpu``.
  ``cuda`` means ``cuda:0``; ``cuda:N`` must exist (ValueError naming ``device``). ``mps``
  is accepted when ``torch.backends.mps.is_available()`` and runs the torch attention path.
  Nothing here has been verified on a Mac: MPS is only resolved, never tested.
- **dtype** (compute and KV cache): ``config.dtype`` when set; else, when ``weights`` is a
  dtype name, that dtype on any device (layers compute in their weights' dtype, so
  ``weights="bfloat16"`` on the CPU computes in bfloat16 and ``weights="float32"`` on CUDA
  is the exact path); else bfloat16 on CUDA when ``torch.cuda.is_bf16_supported()``,
  float16 on older cards, float32 on the CPU and on MPS.
- **KV dtype**: ``config.kv_cache_dtype`` when set; else int8 where the native CPU kernels
  compute in float32: half float16's memory, decode faster at long contexts (16,000
  tokens) and about as fast at 4,000, prefill as fast, replies within the quality rows of
  `folio bench kv` (docs/BENCHMARKS.md, "The CPU default"), where llama.cpp users have to
  find the flag; float16 there when ``block_size`` names fewer tokens than an int8 block
  holds (64). The compute dtype elsewhere. A quantized name ("int8", "int4", "fp8")
  resolves to its format's storage dtype (kernels/kv_format.py), which is the pool's dtype
  and tags its format (`ResolvedDevice.kv_format`). The Triton kernels read a pool in the
  compute dtype or a quantized one (ValueError naming ``kv_cache_dtype`` otherwise); the
  native CPU backend hands the pools its kernels do not read to the PyTorch reference,
  which reads any.
- **block size**: ``config.block_size`` when set; else ``default_block_size`` of the
  resolved KV format (engine/config.py), which the engine's config then holds.
- **attention backend**: ``config.attention_backend``, else $FOLIO_ATTENTION_BACKEND, else
  ``triton`` on CUDA, ``cpu`` (the native C++ kernels) on the CPU when they are built and
  ``torch`` elsewhere (``kernels.default_backend_name``, which kernels.get_backend uses).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from engine.config import EngineConfig, default_block_size
from engine.dtypes import kv_format_of, resolve_dtype
from kernels import BACKEND_ENV, BACKEND_NAMES, default_backend_name
from kernels.kv_format import KVFormat


@dataclass(slots=True, frozen=True)
class ResolvedDevice:
    device: torch.device
    dtype: torch.dtype  # compute dtype; dense weights use it too
    backend: str  # attention backend name: "torch", "triton" or "cpu"
    label: str  # for people: "CUDA 0: NVIDIA H200", "CPU", "Apple GPU (MPS)"
    kv_dtype: torch.dtype  # the KV pool's storage dtype, which tags its format
    block_size: int  # tokens per KV block

    @property
    def kv_format(self) -> KVFormat:
        """What the pool's rows hold (kernels/kv_format.py), told by ``kv_dtype``."""
        return kv_format_of(self.kv_dtype)

    @property
    def status_line(self) -> str:
        """The label with the CPU's kernel path, for the Memory dock: "CPU, native kernels
        (avx2)", or "CPU, PyTorch kernels (native not built)" where the library is not."""
        if self.device.type != "cpu":
            return self.label
        from kernels import cpu

        return f"{self.label}, {cpu.status()}"


def resolve_device(config: EngineConfig) -> ResolvedDevice:
    device = _device(config.device)
    dtype, backend = _dtype(config, device), _backend(config, device)
    kv_dtype = _kv_dtype(config, device, backend, dtype)
    return ResolvedDevice(device, dtype, backend, _label(device), kv_dtype,
                          block_size_for(config, kv_dtype))


def block_size_for(config: EngineConfig, kv_dtype: torch.dtype) -> int:
    """``config.block_size``, or the default for the KV pool stored as ``kv_dtype``."""
    if config.block_size is not None:
        return config.block_size
    return default_block_size(kv_format_of(kv_dtype).name)


def estimate_dtype(config: EngineConfig) -> torch.dtype:
    """The compute dtype for estimates made before loading (the model list): a device
    this machine lacks counts as the default one instead of raising."""
    return _dtype(config, _estimate_device(config))


def estimate_kv_dtype(config: EngineConfig) -> torch.dtype:
    """The KV dtype for estimates made before loading, as estimate_dtype."""
    device = _estimate_device(config)
    try:
        backend = _backend(config, device)
    except ValueError:
        backend = default_backend_name(device)
    return _kv_dtype(config, device, backend, _dtype(config, device), check=False)


def _estimate_device(config: EngineConfig) -> torch.device:
    """config's device, or the default one where this machine lacks it."""
    try:
        return _device(config.device)
    except ValueError:
        return torch.device(default_device_name())


def default_device_name() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def cuda_device_names() -> list[str]:
    """The name of each CUDA device, by index (empty without CUDA): for device pickers."""
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def _device(name: str | None) -> torch.device:
    device = torch.device(name or default_device_name())
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = 0 if device.index is None else device.index
        if index >= count:
            have = f"devices 0..{count - 1}" if count else "no CUDA device"
            raise ValueError(f"EngineConfig.device must be a CUDA device this machine has "
                             f"({have}), got {name!r}")
        return torch.device("cuda", index)
    if device.type == "mps" and not _mps_available():
        raise ValueError(f"EngineConfig.device must be a device this machine has: MPS is "
                         f"not available, got {name!r}")
    return device


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def _dtype(config: EngineConfig, device: torch.device) -> torch.dtype:
    if config.dtype is not None:
        return resolve_dtype(config.dtype)
    if config.weights != "stored":
        return resolve_dtype(config.weights)
    if device.type == "cuda":
        # is_bf16_supported asks the current device; pickers rarely mix card generations.
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def _kv_dtype(config: EngineConfig, device: torch.device, backend: str, dtype: torch.dtype,
              check: bool = True) -> torch.dtype:
    if config.kv_cache_dtype is not None:
        fmt = kv_format_of(config.kv_cache_dtype)
        if check and backend == "triton" and fmt.storage != dtype and not fmt.quantized:
            raise ValueError(f"EngineConfig.kv_cache_dtype must be the compute dtype "
                             f"({str(dtype).removeprefix('torch.')}) or a quantized format "
                             f"(int8, int4, fp8) on the Triton backend, "
                             f"got {config.kv_cache_dtype!r}")
        return fmt.storage
    if device.type == "cpu" and backend == "cpu" and dtype == torch.float32:
        from kernels import cpu

        if cpu.available():
            int8 = kv_format_of("int8")
            fits = config.block_size is None or config.block_size >= int8.min_block_size
            return int8.storage if fits else torch.float16
    return dtype


def _backend(config: EngineConfig, device: torch.device) -> str:
    choice = config.attention_backend or os.environ.get(BACKEND_ENV) or None
    if choice is None:
        return default_backend_name(device)
    if choice not in BACKEND_NAMES:
        raise ValueError(f"{BACKEND_ENV} must be one of {', '.join(BACKEND_NAMES)}, "
                         f"got {choice!r}")
    return choice


def _label(device: torch.device) -> str:
    if device.type == "cuda":
        return f"CUDA {device.index}: {torch.cuda.get_device_name(device.index)}"
    if device.type == "mps":
        return "Apple GPU (MPS)"
    return device.type.upper()
