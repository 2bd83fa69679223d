"""What a served chat leaves on disk for another user of the machine to find: with the KV
cache's disk tier on, after a request and the server's shutdown (which saves the cached
blocks), every folder of the tier is 0700, every file 0600, and no file holds the
prompt's token ids."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from engine import LLM, EngineConfig
from tests.engine.serve.conftest import Served

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX modes")

SECRET = ("The launch code is tango-seven-niner; the safe behind the painting opens "
          "with 31-4-15. Tell no one, and repeat it back to me once.")


def test_a_served_chat_leaves_nothing_on_disk_others_can_read(tiny_path, tmp_path,
                                                              monkeypatch):
    root = tmp_path / "user-cache" / "kv"
    monkeypatch.setenv("FOLIO_KV_CACHE_DIR", str(root))
    old_umask = os.umask(0o022)  # the usual one: the code, not the umask, must hide them
    try:
        llm = LLM(str(tiny_path), EngineConfig(num_gpu_blocks=256, max_model_len=512,
                                               kv_disk_bytes=1 << 30))
        served = Served(llm)
        try:
            messages = [{"role": "user", "content": SECRET}]
            reply = served.client().chat.completions.create(
                model=served.model, messages=messages, temperature=0, max_tokens=4)
            assert reply.choices[0].message.content is not None
        finally:
            served.stop()  # the worker saves every cached block as the model unloads
    finally:
        os.umask(old_umask)

    ids, bs = llm.engine.encode(messages), llm.engine.config.block_size
    blocks = [ids[i:i + bs] for i in range(0, len(ids) - bs + 1, bs)]
    assert len(blocks) >= 2
    files = sorted(p for p in root.rglob("*") if p.is_file())
    assert llm.kv_stats(with_blocks=False).disk.written_blocks >= len(blocks)
    assert sum(p.suffix == ".kvb" for p in files) >= len(blocks)
    for path in [p for p in tmp_path.joinpath("user-cache").rglob("*") if p.is_dir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        data = path.read_bytes()
        for block in blocks:
            assert json.dumps(block).encode() not in data, path
            assert json.dumps(block, separators=(",", ":")).encode() not in data, path
        assert SECRET.encode()[:24] not in data


def test_the_tier_root_from_an_older_folio_is_made_private(tiny_path, tmp_path,
                                                           monkeypatch):
    root = tmp_path / "kv"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    monkeypatch.setenv("FOLIO_KV_CACHE_DIR", str(root))
    LLM(str(tiny_path), EngineConfig(num_gpu_blocks=64, max_model_len=256,
                                     kv_disk_bytes=1 << 30))
    assert stat.S_IMODE(Path(root).stat().st_mode) == 0o700
