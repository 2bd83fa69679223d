"""Block file headers: the tokens as a keyed MAC, never in clear; a header that claims
other tokens, another folder's key or an older Folio's format is a miss, never a crash or
a hit; the folder's key is made once, private, and shared by every store on it."""

from __future__ import annotations

import json
import logging
import os
import stat
import struct
import threading
import zlib
from pathlib import Path

import pytest

from engine.disk import key as disk_key
from engine.disk.group import GroupDisk
from engine.disk.key import KEY_FILE, installation_key
from engine.disk.store import DiskStore

TOKENS = (987654321, 123456789, 555555555, 424242424)
HASH = bytes(range(16))
PAYLOAD = bytes(64)


def saved(root: Path, tokens=TOKENS, block_hash=HASH) -> tuple[DiskStore, GroupDisk, Path]:
    store = DiskStore(root, 1 << 20)
    disk = GroupDisk(store, "fp", 0, len(PAYLOAD))
    disk.save(block_hash, tokens, PAYLOAD)
    store.flush()
    return store, disk, store.path_for("fp", 0, block_hash)


def test_no_token_id_is_in_a_block_file(tmp_path):
    _, disk, path = saved(tmp_path)
    data = path.read_bytes()
    assert json.dumps(list(TOKENS)).encode() not in data
    assert json.dumps(list(TOKENS), separators=(",", ":")).encode() not in data
    for t in TOKENS:
        assert str(t).encode() not in data
    assert disk.load(HASH, TOKENS) == PAYLOAD  # and it is still found and checked


def test_a_header_that_claims_other_tokens_is_a_miss(tmp_path, caplog):
    store, disk, path = saved(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert disk.load(HASH, TOKENS[:-1] + (7,)) is None  # a chain-hash collision
    assert "tokens_mac differs" in caplog.text
    assert store.stats().skipped_files == 1 and store.stats().hit_blocks == 0
    assert not path.exists()


def test_a_file_from_another_folder_is_a_miss(tmp_path):
    _, _, theirs = saved(tmp_path / "theirs")
    store = DiskStore(tmp_path / "ours", 1 << 20)
    disk = GroupDisk(store, "fp", 0, len(PAYLOAD))
    ours = store.path_for("fp", 0, HASH)
    ours.parent.mkdir(parents=True)
    ours.write_bytes(theirs.read_bytes())  # the same block, under another installation key
    assert disk.has(HASH) and disk.load(HASH, TOKENS) is None


def _old_format_file(path: Path, tokens=TOKENS, block_hash=HASH) -> None:
    """A block file as Folio wrote them before the MAC: the tokens in clear."""
    head = json.dumps({"fingerprint": "fp", "group": 0, "hash": block_hash.hex(),
                       "tokens": list(tokens), "size": len(PAYLOAD),
                       "crc32": zlib.crc32(PAYLOAD)}, sort_keys=True).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"FOLIOKV1" + struct.pack("<I", len(head)) + head + PAYLOAD)


def test_an_older_folios_file_is_a_miss_and_removed(tmp_path, caplog):
    store = DiskStore(tmp_path, 1 << 20)  # the folder has its key: a file written since
    disk = GroupDisk(store, "fp", 0, len(PAYLOAD))
    path = store.path_for("fp", 0, HASH)
    _old_format_file(path)  # by an older Folio on the same folder
    assert disk.has(HASH)
    with caplog.at_level(logging.WARNING):
        assert disk.load(HASH, TOKENS) is None
    assert "another version" in caplog.text
    assert not path.exists() and store.stats().hit_blocks == 0


def test_a_folder_an_older_folio_used_loses_its_files_at_open(tmp_path):
    old = [tmp_path / "kv" / "fp" / "0" / f"{bytes([i]).hex() * 16}.kvb" for i in range(3)]
    for i, path in enumerate(old):
        _old_format_file(path, block_hash=bytes([i]) * 16)
    store = DiskStore(tmp_path / "kv", 1 << 20)
    assert not any(p.exists() for p in old)
    assert store.stats().num_blocks == 0
    # The new format's files stay at the next open (the folder has its key now).
    _, _, new = saved(tmp_path / "kv")
    again = DiskStore(tmp_path / "kv", 1 << 20)
    assert new.exists() and again.stats().num_blocks == 1


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
def test_the_key_is_made_once_private_and_shared(tmp_path):
    old = os.umask(0o022)
    try:
        first, made = installation_key(tmp_path)
    finally:
        os.umask(old)
    assert made and len(first) == 32
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    assert installation_key(tmp_path) == (first, False)


def test_stores_opening_a_new_folder_at_once_agree_on_its_key(tmp_path, monkeypatch):
    # Every store has found no key and made its own before any is put in place.
    everyone_made_one = threading.Barrier(8, timeout=30)
    real_create = disk_key.create_private

    def create(path, *chunks):
        real_create(path, *chunks)
        everyone_made_one.wait()

    monkeypatch.setattr(disk_key, "create_private", create)
    keys: list[bytes] = []
    threads = [threading.Thread(target=lambda: keys.append(installation_key(tmp_path)[0]))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and len(set(keys)) == 1
    assert keys[0] == (tmp_path / KEY_FILE).read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name != KEY_FILE]


def test_a_damaged_key_is_replaced_and_its_files_are_misses(tmp_path):
    saved(tmp_path)
    (tmp_path / KEY_FILE).write_bytes(b"short")
    store = DiskStore(tmp_path, 1 << 20)
    assert len((tmp_path / KEY_FILE).read_bytes()) == 32
    assert GroupDisk(store, "fp", 0, len(PAYLOAD)).load(HASH, TOKENS) is None
