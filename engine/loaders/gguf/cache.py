"""The GGUF conversion cache: one entry per file (keyed by its path, size and mtime, and the
transformers version that saved the tokenizer) holding ``meta.json`` (the config, the
transformers config built from it and the tensor directory) and the saved tokenizer.

Reading an entry back imports no transformers model code: the config comes back as a
``FileConfig`` and the tokenizer as it was saved: Folio's own tokenizer object for the
files whose tokenizer Folio builds (no transformers import at all), else through
transformers' tokenizers-backed class itself, the class AutoTokenizer picks for every
tokenizer the GGUF conversion saves (AutoTokenizer would first import the auto mappings
and the family's config module to find it out).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from importlib.metadata import version
from pathlib import Path

log = logging.getLogger(__name__)

# 2: each tensor entry gained the norm offset to subtract. 3: and a value transform.
# 4: the transformers config built from the file, kept whole ("hf_config").
# 5: the tokenizers Folio builds saved as its own object (engine/text/file_tokenizer.py).
CACHE_VERSION = 5
# The tokenizer classes that are transformers' tokenizers-backed class itself.
_BACKEND_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def cache_root() -> Path:
    import platformdirs

    return Path(os.environ.get("FOLIO_CACHE_DIR") or platformdirs.user_cache_dir("folio"))


def cache_entry(path: Path) -> Path:
    stat = path.stat()
    # The transformers version is in the key: a tokenizer saved by one may not load in another.
    key = f"{CACHE_VERSION}|{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|" \
          f"{version('transformers')}"
    return cache_root() / "gguf" / hashlib.sha256(key.encode()).hexdigest()[:24]


def read_meta(entry: Path) -> dict | None:
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("version") != CACHE_VERSION:
        return None
    return meta


def read_tokenizer(folder: Path):
    """The tokenizer saved in `folder`: Folio's own object where it saved one, else as
    AutoTokenizer would load it."""
    from engine.text.file_tokenizer import CONFIG_FILE, FileTokenizer

    if (folder / CONFIG_FILE).is_file():
        return FileTokenizer.from_folder(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    return transformers_tokenizer(folder, config)


def transformers_tokenizer(folder: Path, config: Mapping[str, object]):
    """The tokenizer in ``folder`` (``config``: its tokenizer_config.json) as AutoTokenizer
    loads it: through transformers' tokenizers-backed class directly where the config
    names that class and tokenizer.json is there (AutoTokenizer would first import the
    auto mappings and the family's config module to find it out)."""
    if (config.get("tokenizer_class") in _BACKEND_CLASSES
            and (folder / "tokenizer.json").is_file()):
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(folder, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True, use_fast=True)


def write_cache(entry: Path, meta: dict, tokenizer) -> None:
    """Write the entry atomically; failures only warn, since the cache saves time but
    loading works without it."""
    def fill(tmp: Path) -> None:
        tokenizer.save_pretrained(tmp / "tokenizer")
        (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        drop_stale_entries(entry.parent, meta["source"])

    replace_entry(entry, fill)


def replace_entry(entry: Path, fill: Callable[[Path], None]) -> None:
    """The folder ``entry`` replaced by what ``fill`` writes into a temporary folder beside
    it, renamed into place (a reader never sees half an entry); an OSError only warns."""
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
        fill(tmp)
        shutil.rmtree(entry, ignore_errors=True)
        tmp.rename(entry)
    except OSError as exc:
        log.warning("cannot write the cache entry %s: %s", entry, exc)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def drop_stale_entries(root: Path, source: str, record: str = "meta.json") -> None:
    """Remove the entries under ``root`` whose ``record`` file names ``source``: those of
    an older version of the same file (other size or mtime) are dead weight."""
    for meta_file in root.glob(f"*/{record}"):
        if meta_file.parent.name.startswith("."):  # entries being written, ours included
            continue
        try:
            stale = json.loads(meta_file.read_text(encoding="utf-8")).get("source") == source
        except (OSError, ValueError, AttributeError):
            continue
        if stale:
            shutil.rmtree(meta_file.parent, ignore_errors=True)
