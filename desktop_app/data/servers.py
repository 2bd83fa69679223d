"""Remote OpenAI-compatible servers the user added as model sources (no Qt here).

A server entry names a base URL (``http://gpu-box:8000/v1``) and one model it serves. It
is loaded like a local model, through a *source* string, ``remote:<base_url>#<model>``,
which carries no secret: the API key lives in the entry only when the user ticked
"Remember the key", and otherwise only in memory for the session.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REMOTE_PREFIX = "remote:"


def normalize_base_url(url: str) -> str:
    """``gpu-box:8000`` -> ``http://gpu-box:8000/v1``; raises ValueError on a URL that is
    not http(s) or has no host."""
    text = url.strip()
    if not text:
        raise ValueError("Enter the server's base URL, e.g. http://gpu-box:8000/v1")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url.strip()!r} is not an http(s) URL with a host, e.g. "
                         "http://gpu-box:8000/v1")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"{url.strip()!r} has a bad port: {exc}") from exc
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def server_source(base_url: str, model: str) -> str:
    return f"{REMOTE_PREFIX}{base_url}#{model}"


def is_remote_source(source: str | None) -> bool:
    return bool(source) and source.startswith(REMOTE_PREFIX) and "#" in source


def parse_server_source(source: str) -> tuple[str, str]:
    """(base_url, model) of a ``remote:`` source; ValueError for anything else."""
    if not is_remote_source(source):
        raise ValueError(f"not a remote server source: {source!r}")
    base_url, _, model = source[len(REMOTE_PREFIX):].partition("#")
    if not base_url or not model:
        raise ValueError(f"not a remote server source: {source!r}")
    return base_url, model


def host_of(base_url: str) -> str:
    """``http://gpu-box:8000/v1`` -> ``gpu-box:8000``."""
    return urlsplit(base_url).netloc or base_url


@dataclass(slots=True)
class ServerEntry:
    base_url: str
    model: str
    # "" unless the user ticked "Remember the key"; never in repr (logs, tracebacks).
    api_key: str = field(default="", repr=False)
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.base_url, str) or not self.base_url:
            raise ValueError(f"ServerEntry.base_url must be a URL, got {self.base_url!r}")
        self.base_url = normalize_base_url(self.base_url)
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"ServerEntry.model must be a model id, got {self.model!r}")
        if not isinstance(self.api_key, str):
            raise ValueError("ServerEntry.api_key must be a string")
        if self.max_model_len is not None and (
                not isinstance(self.max_model_len, int) or isinstance(self.max_model_len, bool)
                or self.max_model_len < 1):
            raise ValueError(f"ServerEntry.max_model_len must be an integer >= 1 or None, "
                             f"got {self.max_model_len!r}")

    @property
    def source(self) -> str:
        return server_source(self.base_url, self.model)

    @property
    def host(self) -> str:
        return host_of(self.base_url)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> ServerEntry:
        if isinstance(data, ServerEntry):
            return data
        if not isinstance(data, dict):
            raise ValueError(f"a server entry must be a JSON object, got {data!r}")
        known = {"base_url", "model", "api_key", "max_model_len"}
        return cls(**{k: v for k, v in data.items() if k in known})
