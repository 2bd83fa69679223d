"""The disk tier's files and folders: private (0600, 0700) from the moment they are made,
whatever the umask lets through; an older Folio's looser folder tightened at open; a
killed writer's temporary files removed at open and counted, a live writer's kept."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.disk import files as disk_files
from engine.disk.group import GroupDisk
from engine.disk.store import DiskStore

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX modes")


@pytest.fixture(autouse=True)
def usual_umask():
    """The common 022: files would be 0644 and folders 0755 unless the code asks less."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def every_entry(root: Path) -> list[Path]:
    return [root, *root.rglob("*")]


def test_every_folder_is_0700_and_every_file_0600(tmp_path):
    root = tmp_path / "cache" / "folio" / "kv"  # none of it there yet
    store = DiskStore(root, 1 << 20)
    disk = GroupDisk(store, "fp", 0, 10)
    disk.save(b"\x01" * 16, (1, 2, 3), b"k" * 10)
    store.flush()
    assert store.stats().written_blocks == 1
    made = [p for p in every_entry(tmp_path / "cache") if p != tmp_path]
    assert {p.name for p in made} >= {"folio", "kv", "fp", "0", "tier.key"}
    for path in made:
        assert mode(path) == (0o700 if path.is_dir() else 0o600), path


def test_the_file_is_private_before_its_rename(tmp_path, monkeypatch):
    """No moment with the K/V in a file others may read (not a chmod after the write)."""
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append((Path(src).name, mode(Path(src)), Path(src).stat().st_size))
        real_replace(src, dst)

    monkeypatch.setattr(os, "chmod", lambda *a, **k: pytest.fail("chmod of a new file"))
    store = DiskStore(tmp_path / "kv", 1 << 20)
    monkeypatch.setattr(os, "replace", replace)
    GroupDisk(store, "fp", 0, 1000).save(b"\x02" * 16, (4, 5), b"v" * 1000)
    store.flush()
    assert len(seen) == 1 and seen[0][0].endswith(".tmp")
    assert seen[0][1] == 0o600 and seen[0][2] > 1000


def test_an_older_folios_loose_folders_are_tightened_at_open(tmp_path):
    root = tmp_path / "kv"
    group = root / "fp" / "0"
    group.mkdir(parents=True)
    (group / f"{'ab' * 16}.kvb").write_bytes(b"FOLIOKV1 ... its tokens in clear")
    for level in (root, root / "fp", group):
        level.chmod(0o755)
    DiskStore(root, 1 << 20)
    assert sorted(p.name for p in every_entry(root)) == ["0", "fp", "kv", "tier.key"]
    for path in every_entry(root):
        assert mode(path) == (0o700 if path.is_dir() else 0o600), path


def test_a_block_file_made_readable_by_hand_is_tightened_at_open(tmp_path):
    store = DiskStore(tmp_path, 1 << 20)
    GroupDisk(store, "fp", 0, 10).save(b"\x01" * 16, (1, 2, 3), b"k" * 10)
    store.flush()
    for path in every_entry(tmp_path):
        path.chmod(0o755 if path.is_dir() else 0o644)
    assert DiskStore(tmp_path, 1 << 20).stats().num_blocks == 1
    for path in every_entry(tmp_path):
        assert mode(path) == (0o700 if path.is_dir() else 0o600), path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _temp(folder: Path, name: str, size: int, age_s: float = 0.0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"t" * size)
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def test_a_killed_writers_temporary_files_are_removed_and_counted_at_open(tmp_path):
    root = tmp_path / "kv"
    group = root / "fp" / "0"
    dead = _dead_pid()
    killed = _temp(group, f".ab.kvb.{dead}.1234abcd.7.tmp", 5000)
    old = _temp(group, f".cd.kvb.{os.getppid()}.1234abcd.8.tmp", 5000, age_s=3600)
    live = _temp(group, f".ef.kvb.{os.getppid()}.1234abcd.9.tmp", 5000)  # being written
    older_format = _temp(group, f".ab.kvb.{dead}.3.tmp", 5000, age_s=3600)
    store = DiskStore(root, 1 << 20)
    assert not killed.exists() and not old.exists() and not older_format.exists()
    assert live.exists()
    stats = store.stats()
    assert stats.stale_files == 3
    assert stats.num_blocks == 0 and stats.num_bytes == 0  # never counted as blocks


def test_stale_tells_a_killed_writer_from_a_live_one():
    now = time.time()
    name = ".{}.kvb.{}.00ff00ff.1.tmp"
    assert disk_files.stale(name.format("aa", _dead_pid()), now, now)
    assert not disk_files.stale(name.format("aa", os.getppid()), now, now)
    assert not disk_files.stale(name.format("aa", os.getpid()), now, now)
    assert disk_files.stale(name.format("aa", os.getpid()), now - 3600, now)
    assert not disk_files.stale(".something.tmp", now, now)  # no pid: the age decides


def test_a_write_that_fails_leaves_no_temporary_file(tmp_path, monkeypatch):
    store = DiskStore(tmp_path, 1 << 20)

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    GroupDisk(store, "fp", 0, 10).save(b"\x03" * 16, (1,), b"x" * 10)
    store.flush()
    assert not store.enabled
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_a_link_in_the_folder_is_not_followed_by_the_tightening(tmp_path):
    outside = tmp_path / "shared"
    outside.mkdir()
    outside.chmod(0o755)
    root = tmp_path / "kv"
    root.mkdir()
    (root / "elsewhere").symlink_to(outside, target_is_directory=True)
    DiskStore(root, 1 << 20)
    assert mode(root) == 0o700 and mode(outside) == 0o755
