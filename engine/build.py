"""Assembly: a model and an `EngineConfig` to the parts an `LLMEngine` runs, each made
whole, in the order their dependencies need, so that nothing is set on a part after it
is made:

    the mmproj file's header (a GGUF model's eyes, checked before anything loads) ->
    model files -> the vision tower (engine/vision), tokenizer, prompt builder,
    grammars -> the model -> KV groups and
    their block counts -> runner -> the disk tier's group views -> KV cache manager
    (built over them) -> disk tier (over the manager and the runner) -> scheduler
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.chat import PromptBuilder
from engine.config import EngineConfig
from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec, group_layers
from engine.core.scheduler import Scheduler
from engine.disk.group import GroupDisk, fingerprint, model_identity
from engine.disk.store import DiskStore, kv_cache_root
from engine.disk.tier import DiskTier
from engine.dtypes import resolve_dtype
from engine.grammar import Grammars
from engine.layers.moe.sparse import expert_bytes
from engine.layers.weights import set_activation_bits
from engine.runner.device import ResolvedDevice, resolve_device
from engine.runner.heap import keep_freed_memory
from engine.runner.kv_cache import KVShape, group_blocks, num_blocks_for
from engine.runner.model_runner import ModelRunner
from engine.runner.state_pool import state_slots
from engine.text.chat_template import ChatTokenizer, chat_tokenizer_for
from engine.vision.inputs import ImageInputs
from engine.vision.load import load_vision
from engine.vision.model import VisionModel

Progress = Callable[[str, float], None]
log = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineParts:
    config: EngineConfig
    resolved_device: ResolvedDevice  # device, compute and KV dtypes, attention backend
    model_name: str
    hf_config: object  # the model's Hugging Face config
    tokenizer: ChatTokenizer
    prompts: PromptBuilder  # the one prompt builder every front end uses (engine/chat)
    grammars: Grammars  # structured output; its token table is built on first use
    weights_bytes: int
    expert_bytes: int  # of a mixture of experts' expert weights (0 for a dense model)
    max_model_len: int
    kv_groups: list[KVGroupSpec]
    runner: ModelRunner
    kv_cache: KVCacheManager
    scheduler: Scheduler
    disk: DiskTier | None  # None: the disk tier is off (``kv_disk_bytes`` 0)
    # The checkpoint's MTP head tensors (``mtp.*``), read only for speculative="mtp";
    # engine/spec/mtp.py builds the head from them.
    mtp_weights: dict | None = None


@dataclass(slots=True, frozen=True)
class _Pools:
    """How the KV cache is cut: the groups, each one's block count, and a hybrid
    model's state slots (their bytes, how many are kept for running states)."""

    groups: list[KVGroupSpec]
    counts: list[int]
    slot_bytes: int
    live_slots: int


def assemble(model: str | Path, config: EngineConfig,
             progress: Progress | None = None) -> EngineParts:
    from engine.loaders import load_model_files
    from engine.loaders.catalog import resolve_model
    from engine.models import build_model, family_of
    from engine.models.qwen35_mtp import split_mtp
    from kernels import get_backend

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    resolved = resolve_device(config)
    config = replace(config, block_size=resolved.block_size)
    device, dtype = resolved.device, resolved.dtype
    if device.type == "cpu":
        keep_freed_memory()  # a prefill's activations reused, not faulted again
    embedder = _embedder(config)  # a bad path fails before minutes of loading
    path = resolve_model(str(model))
    mmproj = _mmproj_header(path, config)  # a bad projector fails before the text weights
    with_mtp = config.speculative == "mtp"
    loaded = load_model_files(path, dtype=dtype, progress=progress,
                              keep_quantized=config.weights == "stored", with_mtp=with_mtp)
    family = family_of(loaded.config)
    vision = _vision(path, mmproj, loaded, dtype, device,  # None: it reads text only
                     resolve_dtype(config.vision_dtype) if config.vision_dtype else None,
                     named=config.mmproj is not None)
    tokenizer = chat_tokenizer_for(loaded.tokenizer, family.turn_format, config.chat_template,
                                   vision.marker_text if vision is not None else None)
    grammars = Grammars(loaded.tokenizer, loaded.config.vocab_size,
                        sorted(tokenizer.eos_token_ids))
    if progress:
        progress("building the model", 0.0)
    net = build_model(loaded.config, dtype, device)
    mtp_weights: dict | None = {} if with_mtp else None
    net.load_weights(loaded.weights if mtp_weights is None
                     else split_mtp(loaded.weights, mtp_weights))
    set_activation_bits(net, config.cpu_activation_bits)
    context = net.max_context_len
    max_model_len = min(config.max_model_len or context, context)
    shape = KVShape.of_model(net, config.block_size, resolved.kv_dtype)
    pools = _cut_pools(net, config, shape, device, dtype, max_model_len)
    runner = ModelRunner(net, shape, pools.groups, pools.counts, config.num_host_blocks,
                         get_backend(device, resolved.backend), device, config.cuda_graphs,
                         max_model_len, ImageInputs(vision) if vision is not None else None,
                         max_num_seqs=config.max_num_seqs)
    store = DiskStore(kv_cache_root(), config.kv_disk_bytes) if config.kv_disk_bytes else None
    views = _group_disks(store, path, resolved, config, shape, runner,
                         mmproj.path if mmproj is not None and vision is not None
                         else None) if store else None
    kv_cache = KVCacheManager.build(
        pools.groups, pools.counts, config.block_size, num_host_blocks=config.num_host_blocks,
        enable_prefix_caching=config.enable_prefix_caching,
        group_block_bytes=[0 if g.linear else shape.block_bytes(g.layers)
                           for g in pools.groups],
        lookahead=config.max_num_batched_tokens, state_slot_bytes=pools.slot_bytes,
        live_state_slots=pools.live_slots, lower_tiers=views)
    kv_cache.partial_from_full = not shape.format.keys_by_block
    disk = DiskTier(store, views, kv_cache, runner) if store is not None and views else None
    scheduler = Scheduler(kv_cache, config.max_num_seqs, config.max_num_batched_tokens,
                          max_model_len)
    return EngineParts(config, resolved, loaded.name, loaded.config, tokenizer,
                       PromptBuilder(tokenizer, family.model_type, max_model_len, vision,
                                     embedder),
                       grammars, net.weight_bytes() + (vision.weight_bytes if vision else 0),
                       expert_bytes(net), max_model_len, pools.groups,
                       runner, kv_cache, scheduler, disk, mtp_weights)


def _mmproj_header(path: Path, config: EngineConfig):
    """The header of the GGUF model's mmproj file (``config.mmproj``, else the one beside
    it), its projector type checked; None when there is none. A file found beside the
    model whose projector type Folio does not run yet leaves the model text only, as it
    loaded before (its name and type logged); named explicitly, it is refused."""
    from engine.loaders.gguf.mmproj import find_mmproj, read_mmproj_header
    from engine.vision.mmproj import projector_of, supported_projectors

    found = find_mmproj(path, config.mmproj)
    if found is None:
        return None
    header = read_mmproj_header(found)
    if config.mmproj is None and header.projector not in supported_projectors():
        log.warning("%s: projector type %r is not one Folio runs; the model reads text "
                    "only", found, header.projector)
        return None
    projector_of(header)
    return header


def _vision(path: Path, mmproj, loaded, dtype: torch.dtype, device: torch.device,
            encoder_dtype: torch.dtype | None, named: bool) -> VisionModel | None:
    """A folder's vision tower, or the one the GGUF model's mmproj file holds (its width
    checked against the text model's, its image tokens looked up in the model's
    vocabulary). ``encoder_dtype``: ``EngineConfig.vision_dtype`` (None: the family's
    choice, ``model.tower_dtype``). A file found beside the model (not ``named``) whose
    projector goes with another family's text model leaves it
    text only, logged; named, it is refused."""
    if mmproj is None:
        return load_vision(path, dtype, device, encoder_dtype)
    from engine.vision.mmproj import load_mmproj, pairs_with

    text = getattr(loaded.config, "text_config", None) or loaded.config
    model_type = str(getattr(text, "model_type", ""))
    if not named and not pairs_with(mmproj, model_type):
        log.warning("%s: projector type %r does not give images to a %s model; the model "
                    "reads text only", mmproj.path, mmproj.projector, model_type)
        return None
    return load_mmproj(mmproj, loaded.tokenizer, int(text.hidden_size), dtype, device,
                       encoder_dtype, model_type)


def _embedder(config: EngineConfig):
    """The embedding model retrieval ranks with (engine/embeddings), loaded once per
    process; a path that is not one is a ValueError naming the setting."""
    if config.embedding_model is None:
        return None
    from engine.embeddings import embedding_model

    return embedding_model(config.embedding_model)


def _cut_pools(net, config: EngineConfig, shape: KVShape, device: torch.device,
               dtype: torch.dtype, max_model_len: int) -> _Pools:
    """A group per attention kind (or one for every layer), the budget's blocks split
    between them, and a hybrid model's state slots as the last group's count."""
    num_blocks = num_blocks_for(config, shape, device, max_model_len)
    windows = net.layer_windows()
    linear = net.linear_layers()
    groups = (group_layers(windows, max_model_len, linear) if config.kv_groups or linear
              else [KVGroupSpec(tuple(range(len(windows))))])
    counts = group_blocks(config, shape, num_blocks, [g for g in groups if not g.linear])
    slot_bytes, live_slots = 0, 1
    if linear:
        slot_bytes = net.deltanet_shape.state_bytes(dtype.itemsize) * len(linear)
        total, live_slots = state_slots(config, slot_bytes, num_blocks * shape.bytes_per_block)
        counts.append(total)
    return _Pools(groups, counts, slot_bytes, live_slots)


def _group_disks(store: DiskStore, path, resolved: ResolvedDevice, config: EngineConfig,
                 shape: KVShape, runner: ModelRunner,
                 mmproj: Path | None = None) -> list[GroupDisk]:
    """Each KV group's view of ``store``. The fingerprint names what a block's K/V
    depends on (model file and the mmproj file its images' embeddings come from, compute
    dtype and KV format, weights mode, kernels' layout,
    block and head shapes) and, per group, its layers and window."""
    # The KV format by name where it is quantized (a float pool keeps its dtype's string,
    # so the files a float16 cache wrote before the formats existed stay readable).
    kv = shape.format.name if shape.format.quantized else str(shape.dtype)
    if shape.format.keys_by_block:  # their keys were rows before: never read those files
        kv += f"/keys-{shape.format.key_layout}"
    model = (model_identity(path), str(resolved.dtype), kv, config.weights,
             config.cpu_activation_bits, resolved.device.type, type(runner.backend).__name__,
             runner.backend.head_major_kv, shape.block_size, shape.num_kv_heads,
             shape.head_size, shape.layer_heads)
    if mmproj is not None:  # only then: the fingerprints of other models stay as they were
        model += (model_identity(mmproj),)
    views = []
    for g, spec in enumerate(runner.kv_groups):
        # A linear group's "blocks" are state snapshots: their layout is the state's.
        layout = repr(runner.model.deltanet_shape) if spec.linear else spec.window
        views.append(GroupDisk(store, fingerprint(model, spec.layers, spec.linear, layout),
                               g, runner.block_payload_bytes(g)))
    return views
