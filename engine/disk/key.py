"""What a block file's header says of its tokens: a keyed hash, never the tokens.

A load must prove that the file found under a block's hash name really holds that block:
the prefix cache in memory never trusts a hash alone (`BlockPool.lookup` compares the
tokens too), and a disk hit must be as sure, since a wrong file's K/V would be used
without a word. The header used to store the block's token ids for that comparison, in
clear: anyone who could read the files could decode them back into the chat.

The header now stores ``tokens_mac``: BLAKE2b keyed with this installation's secret (32
random bytes in ``<root>/tier.key``, 0600, made once), over the block's chain hash and its
tokens. Why this and not the chain hash alone:

- the chain hash (`engine/core/block_hashes.py`) is a public function, 128 bits: a
  collision, found by chance or made on purpose, would have one prompt load another's
  K/V. A MAC under a key no prompt author knows cannot be aimed at; two sequences that
  collide in the chain hash still differ here (to 256 bits), so the file is a miss;
- without the key the MAC tells a reader of the files nothing about the tokens, not even
  a guess checked against it; and because the chain hash is part of its input, two
  files with the same tokens at different places do not show as equal.

What it does not hide: the file name is the chain hash, unkeyed, so someone who can list
the folder can check a guessed prompt, block by block. The folders are 0700
(`files.py`), which is what keeps others from listing them at all.

The key is per tier folder: another installation's files, copied in, are misses. Losing
the key costs only the cache (every file is a miss, then removed).
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from pathlib import Path

from engine.disk.files import (
    PRIVATE_FILE,
    create_private,
    new_nonce,
    temp_path,
    tighten,
    write_private,
)

log = logging.getLogger(__name__)

KEY_FILE = "tier.key"
KEY_BYTES = 32


def tokens_mac(key: bytes, block_hash: bytes, token_ids: tuple[int, ...]) -> str:
    h = hashlib.blake2b(key=key, digest_size=32, person=b"folio-kv-tokens")
    h.update(block_hash)
    h.update(b",".join(str(t).encode() for t in token_ids))
    return h.hexdigest()


def installation_key(root: Path) -> tuple[bytes, bool]:
    """The tier folder's key and whether it was made just now (a folder without one was
    last used by a Folio whose files hold their tokens in clear). Raises OSError."""
    path = root / KEY_FILE
    for _ in range(3):
        try:
            key = path.read_bytes()
        except FileNotFoundError:
            key = None
        if key is not None and len(key) == KEY_BYTES:
            tighten(path, path.stat(), PRIVATE_FILE)  # if made readable since
            return key, False
        new = secrets.token_bytes(KEY_BYTES)
        tmp = temp_path(path, new_nonce(), 0)
        if key is not None:  # damaged: a new one (the files under the old one are misses)
            log.warning("KV disk tier: %s was damaged; made a new one", path)
            write_private(path, tmp, new)
            return new, False
        # Whole under its name or not there: a link fails if another process made the
        # key meanwhile, and then that one is read (two processes share one key).
        create_private(tmp, new)
        try:
            os.link(tmp, path)
        except FileExistsError:
            continue
        except OSError:  # no hard links on this file system: last rename wins
            os.replace(tmp, path)
            return new, True
        finally:
            try:
                tmp.unlink()
            except OSError:
                pass
        return new, True
    raise OSError(f"cannot read or make {path}")
