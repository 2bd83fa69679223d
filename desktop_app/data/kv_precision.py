"""Settings ▸ Engine ▸ KV cache precision: which KV formats the app offers, and what each
costs and holds for a model, before the user picks (no Qt here).

The KV cache holds what the model remembers of every open chat; its precision trades that
memory against the output's faithfulness to the 16-bit cache. A token's KV costs, per KV
layer, K and V for every KV head of ``kernels.kv_format``'s row bytes::

    bytes per token = sum over KV layers of 2 x kv_heads x format.row_bytes(head_dim)

    16-bit: head_dim x 2 bytes; 8-bit (int8): head_dim + a 2-byte scale;
    4-bit (int4, rotated): head_dim / 2 + a 2-byte scale per 64 elements

The tokens a choice holds follow the engine's pool rule (engine.runner.kv_cache,
``planned_blocks``): with a budget ("Memory for chats"), as many whole blocks as it buys,
at most four full contexts; automatic, four full contexts but at most 2 GiB, never less
than one context. So with a budget a smaller format holds more tokens, and automatic it
holds the same contexts in less memory: `fit` reports both.

fp8 (e4m3 with a scale) is a GPU format: offered only for a CUDA device. There the
device default is already 16-bit (the compute dtype, which the Triton kernels need a
16-bit cache to be), so 16-bit is not offered apart: float16 beside bfloat16 compute would
be refused.
"""

from __future__ import annotations

from dataclasses import dataclass

# kernels.kv_format (torch) is imported where it is used: the settings load without torch.

AUTO = "auto"  # the device's default (engine.runner.device)
# (stored value, label) in the order the picker lists them; fp8 only on CUDA.
PRECISIONS = (AUTO, "float16", "int8", "int4", "fp8")
LABELS = {AUTO: "Default", "float16": "16-bit", "int8": "8-bit", "int4": "4-bit",
          "fp8": "8-bit float (fp8)"}
CUDA_ONLY = ("fp8",)
NOT_ON_CUDA = ("float16",)  # the device default is the 16-bit compute dtype there


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What a model's KV costs depend on (engine.loaders.catalog.ModelInfo has them)."""

    kv_layers: int  # layers keeping K and V (a hybrid model's linear layers keep none)
    num_kv_heads: int
    head_dim: int
    context_length: int

    @classmethod
    def of(cls, info) -> ModelShape:
        """From a ModelInfo or a catalog entry (anything with their fields)."""
        return cls(getattr(info, "kv_layers", info.num_layers), info.num_kv_heads,
                   info.head_dim, info.context_length)


@dataclass(frozen=True, slots=True)
class Fit:
    tokens: int  # tokens of context the pool holds (every chat together)
    pool_bytes: int  # what that pool takes
    bytes_per_token: int
    enough: bool  # whether the pool holds one full context (else the model cannot load)


def precision_choices(device: str, cuda: bool) -> tuple[str, ...]:
    """The stored values offered for a device choice ("auto", "cpu", "cuda:N", "mps");
    ``cuda``: whether "auto" means a CUDA device on this machine."""
    on_cuda = device.startswith("cuda") or (device == AUTO and cuda)
    return tuple(p for p in PRECISIONS
                 if (p not in NOT_ON_CUDA if on_cuda else p not in CUDA_ONLY))


def bytes_per_token(shape: ModelShape, name: str) -> int:
    """KV bytes one token costs in format ``name`` (a kv_cache_dtype name)."""
    from engine.models.spec import kv_bytes_per_token

    return kv_bytes_per_token(shape.kv_layers, shape.num_kv_heads, shape.head_dim, name)


def fit(shape: ModelShape, name: str, budget_bytes: int | None,
        block_size: int | None = None) -> Fit:
    """The pool the engine plans for ``shape`` in format ``name`` with the budget
    ``budget_bytes`` (None: automatic) and ``block_size`` (None: the engine's default for
    the format): engine.runner.kv_cache.planned_blocks itself, and where a budget holds
    less than one full context (the engine refuses to load), the whole blocks it would
    buy."""
    from engine.config import EngineConfig
    from engine.runner.kv_cache import KVBudgetError, KVShape, planned_blocks
    from kernels.kv_format import format_named

    if block_size is None:
        block_size = EngineConfig(kv_cache_dtype=name).block_size
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if budget_bytes is not None and budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0 or None, got {budget_bytes}")
    kv = KVShape(shape.kv_layers, shape.num_kv_heads, shape.head_dim, block_size,
                 format_named(name).storage)
    enough = True
    if budget_bytes == 0:  # no EngineConfig takes a zero budget; it buys no block
        blocks, enough = 0, False
    else:
        config = EngineConfig(block_size=block_size, kv_cache_memory_bytes=budget_bytes)
        try:
            blocks = planned_blocks(config, kv, shape.context_length)
        except KVBudgetError:
            blocks, enough = budget_bytes // kv.bytes_per_block, False
    return Fit(blocks * block_size, blocks * kv.bytes_per_block, kv.bytes_per_token, enough)


def default_format_name(engine_config) -> str:
    """The format ``kv_cache_dtype=None`` resolves to for ``engine_config``'s device and
    backend, as the engine would pick it before loading (the model list's rule)."""
    from engine.runner.device import estimate_kv_dtype
    from kernels.kv_format import format_stored_as

    return format_stored_as(estimate_kv_dtype(engine_config)).name


def format_name_for(engine_config) -> str:
    """The KV format a model loaded with ``engine_config`` keeps its cache in."""
    from kernels.kv_format import format_named

    if engine_config.kv_cache_dtype is not None:
        return format_named(engine_config.kv_cache_dtype).name
    return default_format_name(engine_config)


def describe_format(name: str) -> str:
    """"8-bit (int8)": the picker's words for a format, its kv_cache_dtype name after."""
    from kernels.kv_format import format_named

    fmt = format_named(name)
    words = LABELS.get(name) or f"{fmt.bits}-bit"
    return words if name == "fp8" else f"{words} ({name})"


def shape_of_source(source: str | None) -> ModelShape | None:
    """The shape of a local model ("starter", a folder, a .gguf file) from its header;
    None for no model, a server's model or a file that cannot be read."""
    from desktop_app.data.servers import is_remote_source

    if not source or is_remote_source(source):
        return None
    from engine.loaders.catalog import model_info, resolve_model

    try:
        info = model_info(resolve_model(source))
    except (OSError, ValueError):  # FolioLoadError is a ValueError
        return None
    return None if info.error else ModelShape.of(info)


def fit_text(fit_: Fit) -> str:
    """"131,072 tokens in 1.0 GiB": a choice's pool, as the picker shows it."""
    size = fit_.pool_bytes / (1 << 30)
    amount = f"{size:.1f} GiB" if size >= 1 else f"{fit_.pool_bytes / (1 << 20):.0f} MiB"
    text = f"{fit_.tokens:,} tokens in {amount}"
    return text if fit_.enough else f"{text}: less than one full context"
