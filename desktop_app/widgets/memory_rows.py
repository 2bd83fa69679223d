"""The memory panel's "Device memory" figures as text, from a MemoryStats snapshot.

The KV pool is shown twice: reserved (its whole size, set aside when the model loads) and
resident (the pages the OS holds, on the CPU only the blocks written so far), and
"Everything else" is what the weights and the resident pool leave of the memory in use.
"""

from __future__ import annotations

NOT_MEASURED = "not measurable on this system"

# The rows' explanations, shown as tooltips.
TOOLTIPS = {
    "kv_pool": "Memory set aside for the KV cache when the model loaded. On the CPU the "
               "system gives it memory only as chats fill its blocks.",
    "kv_resident": "The part of the KV pool that holds memory now: the blocks written so "
                   "far (all of it on a GPU).",
    "state_pool": "Memory set aside for the linear-attention layers' states (a hybrid "
                  "model such as Qwen3.5): one slot per running chat, the rest snapshots "
                  "that let the next turn resume without recomputing the history.",
    "encoder_cache": "Images the model has already looked at, kept encoded by their "
                     "content so that the next turn with the same picture does not "
                     "encode it again (least recently used out first).",
    "other": "Memory in use that is neither the weights nor the resident part of the KV "
             "pool: libraries, the tokenizer, activations.",
}


def format_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def resident_text(mem) -> str:
    """"12.3 MiB (0.9%)": the pool's resident bytes and their share of the reserve."""
    resident = mem.kv_pool_resident_bytes
    if resident is None:
        return NOT_MEASURED
    share = resident / mem.kv_pool_bytes if mem.kv_pool_bytes else 0.0
    return f"{format_bytes(resident)} ({format_percent(share)})"


def memory_rows(mem) -> dict[str, str]:
    """Label texts for a MemoryStats snapshot, keyed by row name."""
    rows = {"device": mem.device, "weights": format_bytes(mem.weights_bytes),
            "kv_pool": format_bytes(mem.kv_pool_bytes), "kv_resident": resident_text(mem),
            "other": format_bytes(mem.other_bytes)}
    if mem.expert_bytes is not None:  # a mixture of experts
        rows["experts"] = format_bytes(mem.expert_bytes)
    if getattr(mem, "state_pool_bytes", 0):  # a hybrid model's linear layers
        rows["state_pool"] = format_bytes(mem.state_pool_bytes)
    if getattr(mem, "encoder_cache_bytes", 0):  # a vision model's encoded images
        rows["encoder_cache"] = format_bytes(mem.encoder_cache_bytes)
    if mem.device_total_bytes is not None:  # a CUDA device
        rows["total"] = format_bytes(mem.device_total_bytes)
        rows["used"] = format_bytes(mem.device_used_bytes)
        rows["free"] = format_bytes(mem.device_free_bytes)
    else:
        rows["rss"] = format_bytes(mem.process_rss_bytes)
    return rows
