"""The app's engine settings meet this machine: which devices it offers, the EngineConfig a
stored choice becomes (a CUDA device that is gone falls back to automatic, an embedding
model that is gone to none, each with a warning; the MTP head setting, prompt lookup for a
model without one), and the words for a memory budget that cannot hold one context."""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path

from desktop_app.data.engine_settings import DEVICE_AUTO, SPEED_MTP, EngineSettings

logger = logging.getLogger(__name__)

_CUDA = re.compile(r"cuda:(\d+)")


def cuda_device_names() -> list[str]:
    """Each CUDA device's name, by index; empty without CUDA."""
    from engine.runner.device import cuda_device_names as names

    return names()


def device_choices(cuda_names: list[str] | None = None) -> list[tuple[str, str]]:
    """(label, stored value) for the Device picker: Auto, CPU, then each CUDA device."""
    names = cuda_device_names() if cuda_names is None else cuda_names
    auto = f"Auto ({'CUDA 0: ' + names[0] if names else 'CPU'})"
    return [(auto, DEVICE_AUTO), ("CPU", "cpu"),
            *((f"CUDA {i}: {name}", f"cuda:{i}") for i, name in enumerate(names))]


def usable(settings: EngineSettings, cuda_count: int | None = None) -> EngineSettings:
    """`settings`, or automatic device when the stored CUDA device is not on this machine
    (a card removed, settings copied from another computer), and no embedding model when
    the stored one's path is gone (documents are then searched by their words): the app
    still starts."""
    embedding = settings.embedding_model
    if embedding is not None and not Path(embedding).expanduser().exists():
        logger.warning("the embedding model %s is not on this machine: documents are "
                       "searched by their words alone", embedding)
        settings = replace(settings, embedding_model=None)
    match = _CUDA.fullmatch(settings.device)
    if match is None:
        return settings
    count = len(cuda_device_names()) if cuda_count is None else cuda_count
    if int(match.group(1)) < count:
        return settings
    logger.warning("the stored device %s is not on this machine: using %s", settings.device,
                   DEVICE_AUTO)
    return replace(settings, device=DEVICE_AUTO)


def mtp_missing(source: str | None) -> str | None:
    """Why ``source`` (the loaded model) cannot draft with an MTP head, or None when it
    can: what Settings ▸ Engine ▸ Speed says beside a greyed-out "MTP head"."""
    from desktop_app.data.servers import is_remote_source

    if not source or is_remote_source(source):
        return "no local model is loaded"
    from engine.loaders.mtp_probe import mtp_head_missing

    return mtp_head_missing(source)


def config_for_source(config, source: str):
    """``config`` for loading ``source``: the MTP head setting becomes prompt lookup for a
    model without a head (the engine refuses it), so every model still loads."""
    if getattr(config, "speculative", None) != SPEED_MTP or mtp_missing(source) is None:
        return config
    logger.info("%s has no MTP head: drafting with prompt lookup", source)
    return replace(config, speculative="ngram")


def engine_config_for(settings: EngineSettings, cuda_count: int | None = None):
    """The EngineConfig the app loads models with."""
    return usable(settings, cuda_count).to_engine_config()


def describe_memory_error(exc: BaseException) -> str | None:
    """The app's words for engine.runner.kv_cache.KVBudgetError (None for anything else):
    the setting is "Memory for chats" here, not kv_cache_memory_bytes."""
    setting = getattr(exc, "setting", None)
    needed, available = getattr(exc, "needed", None), getattr(exc, "available", None)
    if setting not in ("kv_cache_memory_bytes", "max_model_len") or None in (needed, available):
        return None  # the app never sets gpu_memory_utilization: the engine's words do
    mib = 1 << 20
    one = f"one full context of this model ({exc.tokens} tokens) needs {needed / mib:.0f} MiB"
    if setting == "kv_cache_memory_bytes":
        return (f"Memory for chats is {available / mib:.0f} MiB, but {one}. Raise Memory "
                f"for chats in Settings ▸ Engine, or set it to Automatic.")
    return (f"Only {available / mib:.0f} MiB of device memory is free for chats, but {one}. "
            f"Close other programs using the GPU, or choose the CPU in Settings ▸ Engine.")
