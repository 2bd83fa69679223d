"""What a model folder's sentence-transformers files say about its embeddings:
``modules.json`` (a ``Normalize`` module or not), the pooling module's
``config.json`` (``1_Pooling/config.json``: CLS, mean or last token),
``sentence_bert_config.json`` (``max_seq_length``) and
``config_sentence_transformers.json`` (``prompts``: the text put before a query or a
document). A folder without them gets its kind's defaults (load.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from engine.embeddings.pooling import CLS, LAST, MEAN

_MODES = (("pooling_mode_cls_token", CLS), ("pooling_mode_mean_tokens", MEAN),
          ("pooling_mode_lasttoken", LAST))


@dataclass(slots=True)
class SentenceConfig:
    pooling: str | None = None  # None: the folder does not say
    normalized: bool | None = None
    max_length: int | None = None
    prompts: dict[str, str] = field(default_factory=dict)


def read_sentence_config(folder: Path) -> SentenceConfig:
    """ValueError naming the file for one that says what Folio cannot do (a pooling mode
    other than CLS, mean or last token)."""
    out = SentenceConfig()
    modules = _json(folder / "modules.json")
    if isinstance(modules, list):
        types = [m.get("type", "") for m in modules if isinstance(m, dict)]
        out.normalized = any(t.endswith(".Normalize") for t in types)
        pooling_dir = next((m.get("path", "") for m in modules if isinstance(m, dict)
                            and str(m.get("type", "")).endswith(".Pooling")), None)
        if pooling_dir is not None:
            path = folder / pooling_dir / "config.json"
            pooling = _json(path) or {}
            chosen = [mode for key, mode in _MODES if pooling.get(key)]
            others = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v
                      and k not in dict(_MODES)]
            if others or len(chosen) > 1:
                raise ValueError(f"{path}: pooling {', '.join(others or chosen)}; Folio "
                                 "pools by one of CLS, mean or last token")
            out.pooling = chosen[0] if chosen else None
    bert = _json(folder / "sentence_bert_config.json")
    if isinstance(bert, dict) and isinstance(bert.get("max_seq_length"), int):
        out.max_length = bert["max_seq_length"]
    st = _json(folder / "config_sentence_transformers.json")
    if isinstance(st, dict) and isinstance(st.get("prompts"), dict):
        out.prompts = {k: v for k, v in st["prompts"].items() if isinstance(v, str)}
    return out


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from exc
