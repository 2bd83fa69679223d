"""The "Device memory" rows: the KV pool reserved and resident apart, and what else the
memory in use holds, counted against the resident part only."""

from __future__ import annotations

from desktop_app.widgets.memory_rows import NOT_MEASURED, format_bytes, memory_rows
from engine.runner.memory import MemoryStats

MIB, GIB = 2**20, 2**30


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1024, 737280, 5 * GIB, None)] == [
        "0 B", "1023 B", "1.0 KiB", "720.0 KiB", "5.0 GiB", "n/a"]


def test_a_cpu_pool_counts_only_its_resident_pages():
    # The starter as a new user saw it: RSS 660 MiB, weights 97 MiB, a 1.4 GiB pool of
    # which a few blocks hold tokens. The reserve is not memory in use.
    mem = MemoryStats("CPU", 97 * MIB, 1440 * MIB, None, None, None, 660 * MIB, 5 * MIB)
    assert memory_rows(mem) == {
        "device": "CPU", "weights": "97.0 MiB", "kv_pool": "1.4 GiB",
        "kv_resident": "5.0 MiB (0.3%)", "rss": "660.0 MiB", "other": "558.0 MiB"}
    assert mem.other_bytes == (660 - 97 - 5) * MIB


def test_cuda_counts_the_whole_pool():
    mem = MemoryStats("cuda:0", GIB, 2 * GIB, 80 * GIB, 5 * GIB, 75 * GIB, 3 * GIB, 2 * GIB)
    assert memory_rows(mem) == {
        "device": "cuda:0", "weights": "1.0 GiB", "kv_pool": "2.0 GiB",
        "kv_resident": "2.0 GiB (100.0%)", "total": "80.0 GiB", "used": "5.0 GiB",
        "free": "75.0 GiB", "other": "2.0 GiB"}


def test_without_a_residency_figure_nothing_is_made_up():
    mem = MemoryStats("CPU", 97 * MIB, 1440 * MIB, None, None, None, 660 * MIB)
    rows = memory_rows(mem)
    assert rows["kv_resident"] == NOT_MEASURED and rows["other"] == "n/a"
    assert mem.other_bytes is None
