"""The engine settings the app keeps (Settings ▸ Engine): the device, how weights are held,
and the memory for chats (the KV cache budget). No Qt and no torch here: whether a stored
CUDA device still exists is checked when the engine config is built
(services.engine_bridge.engine_config_for).

In settings.json, under ``"engine"``::

    {"device": "auto", "weights": "stored", "chat_memory_mib": null,
     "cpu_activation_bits": 16, "keep_warm_on_disk": true, "warm_disk_gib": 4,
     "kv_cache_dtype": "auto", "speculative": "ngram", "embedding_model": null}

- ``device``: ``"auto"`` (the GPU when there is one, else the CPU), ``"cpu"``,
  ``"cuda:N"`` or ``"mps"``.
- ``weights``: ``"stored"`` (quantized GGUF weights stay quantized), ``"bfloat16"`` or
  ``"float32"`` (dense weights in that dtype; float32 is the exact path).
- ``cpu_activation_bits``: CPU precision of decode-sized quantized products (EngineConfig's):
  16, exact (the float32 path's tokens), or 8, fast (llama.cpp's arithmetic, decode
  10-20% faster, some tokens differ). A settings file without it reads 16.
- ``chat_memory_mib``: the KV cache budget in MiB; null is automatic: the engine's default,
  four full contexts of the loaded model but at most 2 GiB, and never less than one context
  (engine.runner.kv_cache). That suits a desktop: a small model's chats all fit, and a large
  model does not take gigabytes it may never use away from the rest of the machine.
- ``keep_warm_on_disk`` ("Keep chats warm on disk") and ``warm_disk_gib``: the KV cache's
  disk tier (EngineConfig.kv_disk_bytes): a chat's blocks leaving memory, or still cached
  when the model unloads, are kept on disk, so it reopens warm after a restart; at most
  this many GiB, the least recently used dropped first. A settings file without them reads
  on, 4 GiB.
- ``kv_cache_dtype`` ("KV cache precision"): ``"auto"`` (the device's default,
  engine.runner.device), ``"float16"`` (16-bit), ``"int8"`` (8-bit), ``"int4"`` (4-bit) or
  ``"fp8"`` (8-bit float, offered for CUDA only): EngineConfig.kv_cache_dtype. A smaller
  cache holds more tokens in the same memory for chats (data.kv_precision says how many).
  A settings file without it reads ``"auto"``, the cache every earlier version kept.
- ``speculative`` ("Speed"): ``"ngram"`` (prompt lookup: drafts copied from the chat are
  checked in one step; EngineConfig.speculative), ``"draft:PATH"`` (a draft model: a small
  model with the loaded model's tokenizer drafts every token), ``"mtp"`` (the model's own
  multi-token-prediction head, Qwen3.5's; a model without one uses prompt lookup) or
  ``"off"``. Prompt lookup
  is the default: the reply is the model's own either way, drafts are made only where the
  reply repeats the chat, and a request whose drafts keep failing stops drafting
  (engine/spec/draft_length.py), so a chat that repeats nothing decodes at the plain rate
  (docs/BENCHMARKS.md). A settings file without it reads ``"ngram"``.
- ``embedding_model`` ("Embedding model for documents"): the path of an embedding model's
  folder or .gguf file (bge, nomic-embed-text, Qwen3-Embedding) that ranks a long
  document's passages beside word search (EngineConfig.embedding_model), or null: word
  search (BM25) alone. A settings file without it reads null.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from desktop_app.data.kv_precision import AUTO as KV_AUTO
from desktop_app.data.kv_precision import PRECISIONS
from engine.config import WEIGHTS
from engine.sampling_params import draft_path
from engine.validation import FieldChecker

if TYPE_CHECKING:
    from engine.config import EngineConfig

DEVICE_AUTO = "auto"
WEIGHT_LABELS = {"stored": "As stored in the file", "bfloat16": "bfloat16",
                 "float32": "float32"}
CPU_PRECISION_LABELS = {16: "Exact (16-bit activations)", 8: "Fast (8-bit, as llama.cpp)"}
SPEED_LABELS = {"ngram": "Prompt lookup (drafts from the chat)", "off": "Off",
                "mtp": "MTP head (the model's own drafts)"}
# The Speed value of the model's multi-token-prediction head: offered only for a model
# that ships one (engine.loaders.mtp_probe); a model without one loads with prompt lookup.
SPEED_MTP = "mtp"
MIN_CHAT_MEMORY_MIB = 16
MAX_CHAT_MEMORY_MIB = 1 << 20  # 1 TiB: a typo guard, not a limit anyone meets
MAX_WARM_DISK_GIB = 1024
_DEVICE_FORM = re.compile(r"auto|cpu|mps|cuda:\d+")

_check = FieldChecker("EngineSettings")


@dataclass(slots=True)
class EngineSettings:
    device: str = DEVICE_AUTO
    weights: str = "stored"
    chat_memory_mib: int | None = None  # None = automatic (see the module doc)
    cpu_activation_bits: int = 16  # 16 exact or 8 fast (see the module doc)
    keep_warm_on_disk: bool = True  # the KV cache's disk tier (see the module doc)
    warm_disk_gib: int = 4
    kv_cache_dtype: str = KV_AUTO  # "KV cache precision" (see the module doc)
    speculative: str = "ngram"  # "Speed": speculative decoding (see the module doc)
    embedding_model: str | None = None  # documents' retrieval (see the module doc)

    def __post_init__(self) -> None:
        _check(isinstance(self.device, str) and _DEVICE_FORM.fullmatch(self.device) is not None,
               "device", self.device, "'auto', 'cpu', 'cuda:N' or 'mps'")
        _check(self.weights in WEIGHTS, "weights", self.weights, f"one of {', '.join(WEIGHTS)}")
        mib = self.chat_memory_mib
        ok = mib is None or (isinstance(mib, int) and not isinstance(mib, bool)
                             and MIN_CHAT_MEMORY_MIB <= mib <= MAX_CHAT_MEMORY_MIB)
        _check(ok, "chat_memory_mib", mib,
               f"null (automatic) or an integer in [{MIN_CHAT_MEMORY_MIB}, "
               f"{MAX_CHAT_MEMORY_MIB}]")

        bits = self.cpu_activation_bits
        _check(bits in CPU_PRECISION_LABELS and not isinstance(bits, bool),
               "cpu_activation_bits", bits, "16 or 8")
        _check(isinstance(self.keep_warm_on_disk, bool), "keep_warm_on_disk",
               self.keep_warm_on_disk, "true or false")
        gib = self.warm_disk_gib
        _check(isinstance(gib, int) and not isinstance(gib, bool)
               and 1 <= gib <= MAX_WARM_DISK_GIB, "warm_disk_gib", gib,
               f"an integer in [1, {MAX_WARM_DISK_GIB}]")
        _check(self.kv_cache_dtype in PRECISIONS, "kv_cache_dtype", self.kv_cache_dtype,
               f"one of {', '.join(PRECISIONS)}")
        _check(self.speculative in SPEED_LABELS or draft_path(self.speculative) is not None,
               "speculative", self.speculative,
               f"one of {', '.join(SPEED_LABELS)} or draft:PATH (a draft model)")
        _check(self.embedding_model is None or (isinstance(self.embedding_model, str)
                                                and self.embedding_model.strip() != ""),
               "embedding_model", self.embedding_model,
               "null or the path of an embedding model's folder or .gguf file")

    @property
    def kv_cache_memory_bytes(self) -> int | None:
        return None if self.chat_memory_mib is None else self.chat_memory_mib << 20

    def to_engine_config(self) -> EngineConfig:
        from engine.config import EngineConfig

        device = None if self.device == DEVICE_AUTO else self.device
        return EngineConfig(device=device, weights=self.weights,
                            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
                            cpu_activation_bits=self.cpu_activation_bits,
                            kv_disk_bytes=(self.warm_disk_gib << 30 if self.keep_warm_on_disk
                                           else 0),
                            kv_cache_dtype=(None if self.kv_cache_dtype == KV_AUTO
                                            else self.kv_cache_dtype),
                            speculative=(None if self.speculative == "off"
                                         else self.speculative),
                            embedding_model=self.embedding_model)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineSettings:
        """Strict: unknown keys and bad values raise ValueError (AppSettings.from_dict is
        the lenient reader of the settings file)."""
        if not isinstance(data, dict):
            raise ValueError(f"EngineSettings must be a JSON object, got {data!r}")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"EngineSettings has no field(s) {', '.join(unknown)}")
        return cls(**data)
