"""DiskStore: block files written whole and checked on load; corrupt, truncated, foreign
and swapped files skipped (and removed); the size cap drops the least recently used; a
failing disk turns the tier off once; a writer killed mid-write or a second process on
the same folder leaves every file readable."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine.disk.store import DiskStore

REPO = Path(__file__).resolve().parents[3]
HEADER = {"fingerprint": "fp", "group": 0, "hash": "00", "tokens": [1, 2]}


def header(i: int) -> dict:
    return {**HEADER, "hash": f"{i:02x}"}


def write(store: DiskStore, i: int, payload: bytes) -> Path:
    path = store.path_for("fp", 0, bytes([i]))
    store.put(path, header(i), payload)
    store.flush()
    return path


def test_a_block_round_trips_and_is_counted(tmp_path):
    store = DiskStore(tmp_path, 1 << 20)
    path = write(store, 1, b"kv" * 50)
    assert store.has(path) and path.name == "01.kvb"
    assert store.load(path, header(1), 100) == b"kv" * 50
    stats = store.stats()
    assert (stats.num_blocks, stats.hit_blocks, stats.written_blocks) == (1, 1, 1)
    assert 100 < stats.num_bytes <= 100 + 200  # the header is small
    # A new store on the folder finds it.
    again = DiskStore(tmp_path, 1 << 20)
    assert again.has(path) and again.load(path, header(1), 100) == b"kv" * 50
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign", "swap", "garbage"])
def test_a_bad_file_is_skipped_counted_and_removed(tmp_path, damage, caplog):
    store = DiskStore(tmp_path, 1 << 20)
    path = write(store, 1, bytes(range(100)))
    other = write(store, 2, bytes(range(100, 200)))
    data = path.read_bytes()
    if damage == "flip":
        path.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    elif damage == "truncate":
        path.write_bytes(data[:-7])
    elif damage == "swap":  # another block's file under this name
        path.write_bytes(other.read_bytes())
    elif damage == "garbage":
        path.write_bytes(b"not a block file at all")
    want = header(1) if damage != "foreign" else {**header(1), "fingerprint": "other model"}
    with caplog.at_level(logging.WARNING):
        assert store.load(path, want, 100) is None
    assert store.stats().skipped_files == 1 and "skipped" in caplog.text
    assert not path.exists() and not store.has(path)
    assert store.load(other, header(2), 100) == bytes(range(100, 200))


def test_an_unreadable_file_is_skipped(tmp_path):
    store = DiskStore(tmp_path, 1 << 20)
    path = write(store, 1, b"x" * 10)
    path.unlink()  # gone between the index and the read (another process's cap)
    assert store.load(path, header(1), 10) is None
    assert store.stats().skipped_files == 1


def test_the_cap_drops_the_least_recently_used(tmp_path):
    size = len(write(DiskStore(tmp_path / "probe", 1 << 20), 1, b"a" * 1000).read_bytes())
    store = DiskStore(tmp_path / "kv", 3 * size)
    paths = []
    for i in range(3):
        paths.append(write(store, i, bytes([i]) * 1000))
        time.sleep(0.01)
    assert store.load(paths[0], header(0), 1000) is not None  # 0 is now the most recent
    time.sleep(0.01)
    paths.append(write(store, 3, b"d" * 1000))
    assert [p.exists() for p in paths] == [True, False, True, True]
    assert store.stats().num_bytes <= 3 * size


def test_the_cap_is_enforced_at_open(tmp_path):
    """A tier opened with a smaller cap than its files trims them, least recently used
    first, before anything is written."""
    store = DiskStore(tmp_path, 1 << 20)
    paths = []
    for i in range(4):
        paths.append(write(store, i, bytes([i]) * 1000))
    size = paths[0].stat().st_size
    for age, path in zip((3, 1, 4, 2), paths, strict=True):  # minutes since last used
        then = time.time() - 60 * age
        os.utime(path, (then, then))
    smaller = DiskStore(tmp_path, 2 * size)
    assert [p.exists() for p in paths] == [False, True, False, True]
    stats = smaller.stats()
    assert (stats.num_blocks, stats.num_bytes, stats.written_blocks) == (2, 2 * size, 0)


def test_a_full_disk_turns_the_tier_off_once_and_chats_go_on(tmp_path, monkeypatch, caplog):
    store = DiskStore(tmp_path, 1 << 20)

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with caplog.at_level(logging.WARNING):
        write(store, 1, b"x" * 10)
        write(store, 2, b"x" * 10)
    assert not store.enabled
    assert caplog.text.count("turned off") == 1
    assert not any(tmp_path.rglob("*.kvb")) and not any(tmp_path.rglob("*.tmp"))
    assert not store.has(store.path_for("fp", 0, b"\x01"))


def test_a_read_only_folder_turns_the_tier_off(tmp_path, monkeypatch, caplog):
    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(Path, "mkdir", read_only)  # root ignores chmod: fail as EROFS does
    with caplog.at_level(logging.WARNING):
        store = DiskStore(tmp_path / "kv", 1 << 20)
    assert not store.enabled and caplog.text.count("turned off") == 1
    store.put(store.path_for("fp", 0, b"\x01"), header(1), b"x")
    store.flush()
    assert store.stats().written_blocks == 0


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from engine.disk.store import DiskStore
    store = DiskStore(Path(sys.argv[1]), 1 << 30)
    tag = int(sys.argv[2])
    for i in range(int(sys.argv[3])):
        h = {"fingerprint": "fp", "group": 0, "hash": f"{tag}-{i}", "tokens": [i]}
        store.put(store.path_for("fp", 0, bytes([tag, i % 256, i // 256])), h,
                  bytes([i % 256]) * 200_000)
        if i % 8 == 0:
            store.flush()
            print(i, flush=True)
    store.flush()
""")


def _check_every_file(root: Path) -> int:
    """Load each block file a fresh store finds; every one must be whole."""
    store = DiskStore(root, 1 << 30)
    files = sorted(root.rglob("*.kvb"))
    for path in files:
        tag, lo, hi = path.stem[0:2], path.stem[2:4], path.stem[4:6]
        i = int(lo, 16) + 256 * int(hi, 16)
        want = {"fingerprint": "fp", "group": 0, "hash": f"{int(tag, 16)}-{i}", "tokens": [i]}
        assert store.load(path, want, 200_000) == bytes([i % 256]) * 200_000, path
    return len(files)


def test_a_writer_killed_mid_write_leaves_the_store_readable(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "1", "100000"],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for _ in range(3):
        proc.stdout.readline()  # some blocks are on disk, more are being written
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert _check_every_file(tmp_path) >= 17


def test_two_processes_share_a_folder(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(tag), "40"],
                              cwd=REPO, stdout=subprocess.DEVNULL) for tag in (1, 2)]
    # Meanwhile this process reads whatever is there: never a partial file.
    seen = 0
    while any(p.poll() is None for p in procs):
        seen = max(seen, _check_every_file(tmp_path))
    assert all(p.wait(timeout=60) == 0 for p in procs)
    assert _check_every_file(tmp_path) == 80
