"""The memory panel's "KV cache pool" figures as text, from a KVStats snapshot: the pool's
rows (its precision and bytes per token first), the disk tier's line, a line per KV group,
the blocks each chat holds and the open chat's headroom."""

from __future__ import annotations

from collections.abc import Callable

from desktop_app.data.kv_precision import describe_format
from desktop_app.widgets.memory_rows import format_bytes, format_percent


def kv_rows(kv) -> dict[str, str]:
    """Label texts for a KVStats snapshot, keyed by row name."""
    return {
        "blocks_used": f"{kv.num_used} / {kv.num_blocks}",
        "blocks_shared": str(kv.num_shared),
        "blocks_cached": str(kv.num_cached),
        "blocks_free": str(kv.num_free),
        "block_size": f"{kv.block_size} tokens, {format_bytes(kv.bytes_per_block)}",
        "saved_by_sharing": format_bytes(kv.bytes_saved_by_sharing),
        "waste": format_percent(kv.waste_fraction),
        "hit_rate": (f"{format_percent(kv.hit_rate)} "
                     f"({kv.prefix_hit_tokens} / {kv.prefix_query_tokens} tokens)"),
        "rolled_back": f"{kv.rolled_back_blocks} blocks since start",
    }


def bytes_per_token(kv) -> int:
    """KV bytes one token costs, every KV group's layers together (a token is kept in each
    group: a sliding window's too, until it slides out)."""
    per_block = sum(g.bytes_per_block for g in kv.groups) if kv.groups else kv.bytes_per_block
    return per_block // kv.block_size


def precision_rows(kv, format_name: str | None) -> dict[str, str]:
    """The pool's format ("8-bit (int8)"; MemoryStats.kv_dtype, None where it does not
    say: "n/a") and what a token costs in it ("11.6 KiB"), keyed by row name."""
    return {"kv_precision": "n/a" if format_name is None else describe_format(format_name),
            "kv_per_token": format_bytes(bytes_per_token(kv))}


def disk_row(kv) -> str:
    """The KV cache's disk tier: its blocks and bytes, the blocks read back since start
    and the prompt tokens replies took from them (or why there is no tier).

    The two counts differ: a chat opened is read back ahead of its next turn, whose
    prompt uses those blocks only when it is sent. A block holds `block_size` tokens; a
    model with several KV groups reads a block per group, so its tokens are not counted."""
    disk = kv.disk
    if disk is None:
        return "Off (Settings ▸ Engine ▸ Keep chats warm on disk)"
    if not disk.enabled:
        return "Turned off: the folder could not be written (see the log)"
    read = f"{disk.hit_blocks} block{'s' if disk.hit_blocks != 1 else ''}"
    if len(kv.groups) < 2:
        read += f" ({disk.hit_blocks * kv.block_size:,} tokens)"
    return (f"{disk.num_blocks} blocks, {format_bytes(disk.num_bytes)} of "
            f"{format_bytes(disk.max_bytes)}; {read} read back since start, "
            f"{disk.hit_tokens:,} tokens of them used by replies")


def headroom_text(held: int, room: int) -> str:
    """The open chat's tokens and what it can still take (see headroom_tokens)."""
    return f"This chat holds about {held:,} tokens; it can grow about {room:,} more"


def group_rows(kv) -> list[str]:
    """A line per KV group (global, sliding) when the model has several, else none."""
    groups = kv.groups
    if len(groups) < 2:
        return []
    return [f"{g.name}: {g.num_layers} layer{'s' if g.num_layers != 1 else ''}, "
            f"{g.num_used} / {g.num_blocks} blocks used ({g.num_cached} cached, "
            f"{g.num_free} free), {format_bytes(g.used_bytes)} of {format_bytes(g.pool_bytes)}"
            for g in groups]


def blocks_per_chat(kv, chat_of_owner: Callable[[str], str | None]) -> dict[str, int]:
    """Distinct blocks each chat holds now (a block shared by candidates counts once)."""
    counts: dict[str, int] = {}
    for block in kv.blocks:
        chats = {chat_of_owner(owner) for owner in block.owners} - {None}
        for chat in chats:
            counts[chat] = counts.get(chat, 0) + 1
    return counts


def headroom_tokens(kv, max_model_len: int | None, chat_tokens: int) -> int:
    """About how many more tokens the current chat can take: the free pool (cached blocks
    can be evicted) bounded by what is left of the context window."""
    room = kv.headroom_tokens()
    if max_model_len is not None:
        room = min(room, max(0, max_model_len - chat_tokens))
    return room


