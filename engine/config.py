"""Engine settings, validated when built."""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.dtypes import DTYPE_NAMES, KV_DTYPE_NAMES
from engine.sampling_params import draft_path
from engine.validation import FieldChecker

BLOCK_SIZES = (8, 16, 32, 64)
DEFAULT_SPECULATIVE_TOKENS = 8
MAX_SPECULATIVE_TOKENS = 64
# "stored": quantized GGUF tensors stay quantized (dense ones run in the compute dtype);
# a dtype name: every weight dense in that dtype, the exact path.
WEIGHTS = ("stored", "bfloat16", "float32")
# Only the form is checked here (no torch); runner/device.py checks that the device exists.
_DEVICE_FORM = re.compile(r"cpu|mps|cuda(:\d+)?")

_check = FieldChecker("EngineConfig")


# The fewest tokens a block holds per KV format where it is more than one: an int4 pool
# quantizes each key channel over its block's tokens, an int8 pool its keys around the
# block's channel centers, the block's parameters in its rows' spare bytes
# (kernels/kv_key_channels.py, kernels/kv_key_centers.py: KVFormat.min_block_size, which
# a test holds equal; this module imports no torch).
MIN_BLOCK_SIZES = {"int4": 32, "int8": 64}


def default_block_size(kv_cache_dtype: str | None) -> int:
    """Tokens per block where ``block_size`` is not named: 16, or the KV format's least
    where more."""
    return max(16, MIN_BLOCK_SIZES.get(kv_cache_dtype, 1))


@dataclass(slots=True)
class EngineConfig:
    # Tokens per KV block; None: default_block_size of the KV format, settled here when
    # kv_cache_dtype is named, else with the device's KV dtype (runner/device.py), after
    # which the engine's config holds it.
    block_size: int | None = None
    # KV pool size: either a block count, or derived from a memory budget.
    num_gpu_blocks: int | None = None
    # KV pool budget in bytes on any device; None = the default (runner/kv_cache.py).
    kv_cache_memory_bytes: int | None = None
    # Server-style sizing, CUDA only and only without a budget: the pool fills this share
    # of the card's total memory, less what is already in use. None = desktop sizing (a few
    # full contexts, runner/kv_cache.py).
    gpu_memory_utilization: float | None = None
    num_host_blocks: int = 0  # host pool for swap preemption; 0 = recompute
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512  # per-step token budget (prefill chunk size)
    max_model_len: int | None = None  # None = the model's context length
    enable_prefix_caching: bool = True
    # A block pool and table per attention kind, so sliding-window layers hold only their
    # window (engine/core/kv_cache_manager.py); False: one pool for every layer, as before.
    kv_groups: bool = True
    # The KV cache's disk tier ("Keep chats warm on disk"): full blocks leaving memory are
    # kept under FOLIO_CACHE_DIR/kv, this many bytes at most; 0: off.
    kv_disk_bytes: int = 0
    # One short request through the whole step at load (as llama.cpp does), moving the
    # first forward's one-time costs from the first reply to the load. Off: measured in
    # fresh processes (docs/ARCHITECTURE.md, "Warm-up") it cost more at load than the
    # first reply saved.
    warm_up: bool = False
    dtype: str | None = None  # compute dtype; None = the device's (runner/device.py)
    # A vision tower's compute dtype; None = the model's, except bfloat16 for a family
    # measured faster so (engine/vision/model.py ``VisionFamily.cpu_bfloat16``) on a CPU
    # with bfloat16 matrix units when the model computes in float32.
    vision_dtype: str | None = None
    # The KV cache's dtype: a float dtype, or a quantized format ("int8", "int4", "fp8";
    # kernels/kv_format.py says what their rows hold). None = the backend's
    # (runner/device.py: int8 on the native CPU kernels, float16 there with blocks under
    # int8's 64 tokens, else the compute dtype).
    kv_cache_dtype: str | None = None
    device: str | None = None  # "cpu", "cuda", "cuda:N", "mps"; None = CUDA when available
    weights: str = "stored"  # one of WEIGHTS
    attention_backend: str | None = None  # None = auto (runner/device.py: triton, cpu, torch)
    # Decode steps replayed as CUDA graphs (engine/runner/cuda_graphs.py) on CUDA with the
    # Triton backend; elsewhere, or False, every step runs eagerly.
    cuda_graphs: bool = True
    # Decode-sized quantized products on the native CPU library: 16 keeps ~15 bits of each
    # activation (an 8-bit row plus its 8-bit residual: the float32 path's greedy tokens);
    # 8, one 8-bit row as llama.cpp does: decode 10-20% faster, some greedy tokens move.
    # Prefill batches take the 16-bit tiles either way (AVX-512; AVX2 from 128 rows).
    cpu_activation_bits: int = 16
    num_threads: int | None = None  # torch CPU threads; None = torch's default
    seed: int = 0
    # A Jinja chat template instead of the model file's (None: the file's, else the
    # family's turn format, engine/text/turn_formats.py); checked by rendering a two-turn
    # chat when the engine loads.
    chat_template: str | None = None
    # Speculative decoding for every request (engine/spec): "ngram" (prompt lookup) or
    # "draft:PATH" (a small model with the same vocabulary drafts: a folder, a .gguf file
    # or "starter") or "mtp" (the model's multi-token-prediction head, Qwen3.5's; the
    # engine refuses a model without one); None decodes plainly unless a request asks
    # (SamplingParams.speculative or .prediction).
    speculative: str | None = None
    # The most drafts a candidate checks in one step (each follows what the model keeps).
    num_speculative_tokens: int = DEFAULT_SPECULATIVE_TOKENS
    # An embedding model (a folder or a .gguf file, engine/embeddings) that a long
    # document's retrieval ranks passages with beside BM25; None: BM25 alone.
    embedding_model: str | None = None
    # A GGUF model's vision projector (llama.cpp's mmproj file, engine/vision/mmproj.py);
    # None: the file in the model's folder whose name holds "mmproj", if there is one.
    mmproj: str | None = None

    def __post_init__(self) -> None:
        if self.block_size is None and self.kv_cache_dtype is not None:
            self.block_size = default_block_size(self.kv_cache_dtype)
        _check.types(
            self,
            integers=("block_size", "num_gpu_blocks", "kv_cache_memory_bytes", "num_host_blocks",
                      "max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_threads",
                      "seed", "cpu_activation_bits", "kv_disk_bytes",
                      "num_speculative_tokens"),
            numbers=("gpu_memory_utilization",),
        )
        _check(self.block_size is None or self.block_size in BLOCK_SIZES, "block_size",
               self.block_size, f"one of {BLOCK_SIZES} or None")
        _check(self.num_gpu_blocks is None or self.num_gpu_blocks >= 1, "num_gpu_blocks",
               self.num_gpu_blocks, ">= 1 or None")
        _check(self.kv_cache_memory_bytes is None or self.kv_cache_memory_bytes > 0,
               "kv_cache_memory_bytes", self.kv_cache_memory_bytes, "> 0 or None")
        _check(self.gpu_memory_utilization is None or 0 < self.gpu_memory_utilization <= 1,
               "gpu_memory_utilization", self.gpu_memory_utilization, "in (0, 1] or None")
        _check(self.num_host_blocks >= 0, "num_host_blocks", self.num_host_blocks, ">= 0")
        _check(self.max_num_seqs >= 1, "max_num_seqs", self.max_num_seqs, ">= 1")
        _check(self.max_num_batched_tokens >= 1, "max_num_batched_tokens",
               self.max_num_batched_tokens, ">= 1")
        _check(self.max_model_len is None or self.max_model_len >= 1, "max_model_len",
               self.max_model_len, ">= 1 or None")
        _check(self.dtype is None or self.dtype in DTYPE_NAMES, "dtype", self.dtype,
               f"one of {DTYPE_NAMES} or None")
        _check(self.vision_dtype is None or self.vision_dtype in DTYPE_NAMES, "vision_dtype",
               self.vision_dtype, f"one of {DTYPE_NAMES} or None")
        _check(self.kv_cache_dtype is None or self.kv_cache_dtype in KV_DTYPE_NAMES,
               "kv_cache_dtype", self.kv_cache_dtype, f"one of {KV_DTYPE_NAMES} or None")
        least = MIN_BLOCK_SIZES.get(self.kv_cache_dtype, 1)
        _check(self.block_size is None or self.block_size >= least, "block_size", self.block_size,
               f">= {least} with kv_cache_dtype {self.kv_cache_dtype!r} (a block's keys are "
               f"quantized over its tokens)")
        _check(self.device is None or (isinstance(self.device, str)
                                       and _DEVICE_FORM.fullmatch(self.device) is not None),
               "device", self.device, "'cpu', 'cuda', 'cuda:N', 'mps' or None")
        _check(self.weights in WEIGHTS, "weights", self.weights, f"one of {WEIGHTS}")
        # Layers compute in their weights' dtype: dense weights in one dtype and compute in
        # another would need a cast per matmul, which no layer does.
        _check(self.weights == "stored" or self.dtype in (None, self.weights), "weights",
               self.weights, f"'stored' or the same as dtype ({self.dtype!r}) when both are set")
        _check(self.attention_backend in (None, "torch", "triton", "cpu"), "attention_backend",
               self.attention_backend, "'torch', 'triton', 'cpu' or None")
        _check(self.cpu_activation_bits in (8, 16), "cpu_activation_bits",
               self.cpu_activation_bits, "8 or 16")
        _check(isinstance(self.kv_groups, bool), "kv_groups", self.kv_groups, "True or False")
        _check(isinstance(self.cuda_graphs, bool), "cuda_graphs", self.cuda_graphs,
               "True or False")
        _check(isinstance(self.warm_up, bool), "warm_up", self.warm_up, "True or False")
        _check(self.kv_disk_bytes >= 0, "kv_disk_bytes", self.kv_disk_bytes,
               ">= 0 (bytes; 0: off)")
        _check(self.num_threads is None or self.num_threads >= 1, "num_threads",
               self.num_threads, ">= 1 or None")
        _check(self.speculative in (None, "ngram", "mtp")
               or draft_path(self.speculative) is not None, "speculative", self.speculative,
               "'ngram', 'draft:PATH' (a draft model), 'mtp' (the model's MTP head) or None")
        _check(1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS,
               "num_speculative_tokens", self.num_speculative_tokens,
               f"an integer in [1, {MAX_SPECULATIVE_TOKENS}]")
        _check(self.embedding_model is None or (isinstance(self.embedding_model, str)
                                                and self.embedding_model.strip() != ""),
               "embedding_model", self.embedding_model,
               "the path of an embedding model's folder or .gguf file, or None")
        _check(self.mmproj is None or (isinstance(self.mmproj, str)
                                       and self.mmproj.strip() != ""),
               "mmproj", self.mmproj, "the path of an mmproj .gguf file, or None")
        _check(self.chat_template is None or (isinstance(self.chat_template, str)
                                              and self.chat_template.strip() != ""),
               "chat_template", self.chat_template, "a Jinja template or None")

    @property
    def draft_model(self) -> str | None:
        """The draft model's path of ``speculative="draft:PATH"``, else None."""
        return draft_path(self.speculative)

    @property
    def preemption_mode(self) -> str:
        return "swap" if self.num_host_blocks > 0 else "recompute"

