"""A Hugging Face folder's config and tokenizer class, kept between loads.

The first load of a folder builds its config with transformers' class for its model type
(importing that family's configuration module, which pulls in much of transformers'
model code); the config is kept whole as the GGUF cache keeps a file's
(gguf/file_config.py's ``config_record``), keyed by the folder's path, its config.json's
size and mtime and the transformers version. A later load reads it back as the same
``FileConfig`` a cached GGUF gives, importing no transformers model code.

The tokenizer's first load goes through transformers (its tokenizers-backed class
directly where tokenizer_config.json names it: AutoTokenizer would first import the
family's config module to find the class out). Where Folio's own tokenizer object answers
as that tokenizer does (``FileTokenizer.from_transformers``), the load gives that object,
saved in an entry of its own keyed by the tokenizer files' sizes and mtimes, so a later
load reads it back without importing transformers at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from importlib.metadata import version
from pathlib import Path

from engine.loaders.gguf.cache import (
    cache_root,
    drop_stale_entries,
    replace_entry,
    transformers_tokenizer,
)
from engine.loaders.gguf.file_config import FileConfig, config_from_record, config_record
from engine.text.file_tokenizer import CONFIG_FILE, FileTokenizer

log = logging.getLogger(__name__)

FOLDER_CACHE_VERSION = 1
# The files transformers reads a folder's tokenizer from: a change to any is a new entry.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "added_tokens.json", "chat_template.jinja", "chat_template.json",
                    "tokenizer.model", "vocab.json", "merges.txt")
# A tokenizer entry's record of its folder: an older entry of the same folder is dropped.
_SOURCE = "source.json"


def _entry(folder: Path) -> Path:
    stat = (folder / "config.json").stat()
    key = (f"{FOLDER_CACHE_VERSION}|{folder.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|"
           f"{version('transformers')}")
    return cache_root() / "hf" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def read_config(folder: Path) -> tuple[FileConfig, str | None] | None:
    """The folder's config (its text part's, for a multimodal checkpoint) and that part's
    weight prefix, as a first load kept them; None when there is no usable entry."""
    try:
        kept = json.loads(_entry(folder).read_text(encoding="utf-8"))
        return config_from_record(kept["config"]), kept["prefix"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_config(folder: Path, config, prefix: str | None) -> None:
    """Keep ``config`` (a transformers config) for later loads; a config whose layers
    differ (no record) is not kept, and failures only warn."""
    record = config_record(config)
    if record is None:
        return
    entry = _entry(folder)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=entry.parent, suffix=".tmp", delete=False,
                                         encoding="utf-8") as handle:
            json.dump({"config": record, "prefix": prefix}, handle)
        Path(handle.name).replace(entry)  # atomic: a reader never sees half an entry
    except (OSError, TypeError, ValueError) as exc:
        log.warning("cannot keep the config of %s: %s", folder, exc)


def load_tokenizer(folder: Path):
    """The folder's tokenizer: Folio's own object as an earlier load saved it, else as
    transformers loads it (then saved as Folio's object where that answers the same)."""
    entry = _tokenizer_entry(folder)
    if (entry / CONFIG_FILE).is_file():
        try:
            return FileTokenizer.from_folder(entry)
        except Exception as exc:  # a damaged entry is written again, not fatal
            log.warning("reading the tokenizer of %s again: %s", folder, exc)
    tokenizer = _transformers_tokenizer(folder)
    own = FileTokenizer.from_transformers(tokenizer)
    if own is None:
        return tokenizer
    source = str(folder.resolve())

    def fill(tmp: Path) -> None:
        own.save_pretrained(tmp)
        (tmp / _SOURCE).write_text(json.dumps({"source": source}), encoding="utf-8")
        drop_stale_entries(entry.parent, source, _SOURCE)

    replace_entry(entry, fill)
    return own


def _transformers_tokenizer(folder: Path):
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    return transformers_tokenizer(folder, config if isinstance(config, dict) else {})


def _tokenizer_entry(folder: Path) -> Path:
    stats = [(name, (folder / name).stat()) for name in _TOKENIZER_FILES
             if (folder / name).is_file()]
    key = "|".join([str(FOLDER_CACHE_VERSION), str(folder.resolve()), version("transformers"),
                    *(f"{name}:{st.st_size}:{st.st_mtime_ns}" for name, st in stats)])
    return cache_root() / "hf-tokenizer" / hashlib.sha256(key.encode()).hexdigest()[:24]
