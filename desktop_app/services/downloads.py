"""Download a model from the Hugging Face Hub into the HF cache (no Qt here).

Run it on a plain thread; the GUI wraps it and re-emits progress as signals::

    cancel = threading.Event()
    def on_progress(p: DownloadProgress) -> None:   # called on the download thread
        print(p.done_bytes, "/", p.total_bytes, p.file_name)
    try:
        result = download_model("HuggingFaceTB/SmolLM2-135M-Instruct",
                                on_progress=on_progress, cancel=cancel)
        result.path          # the snapshot folder: config.json, tokenizer files, weights
    except DownloadError as err:
        show(err.message)    # user-facing text; err.kind says which failure it was

Only what Folio needs to run a model of one of its families (the decoder-only families
registered in engine/models/registry.py) is fetched, from the repo's top level: config,
generation config, tokenizer files, chat template and either the safetensors weights or one
chosen ``.gguf`` file (``gguf_file=``; ``list_model_files`` lists the choices).

Files download into a private folder inside the cache (``_Partial``) and move into place
only when all of them are there, so a failed or cancelled download leaves no half-written
model in the cache. The private folder stays: downloading the same model again resumes
where the bytes stopped, file by file and inside a file (an HTTP range request), so a
cancel or a dropped connection loses nothing already downloaded.
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import os
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import HfApi, constants, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import build_hf_headers

from desktop_app.services.partial_download import CHUNK_SIZE, PartialDownload  # noqa: F401

# Everything but the weights; matched against top-level file names.
MODEL_FILE_PATTERNS = ("config.json", "generation_config.json", "tokenizer*",
                       "special_tokens_map.json", "vocab.json", "merges.txt",
                       "chat_template.json", "chat_template.jinja")
SAFETENSORS_INDEX = "model.safetensors.index.json"
_REPO_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$")

OFFLINE_MESSAGE = "could not reach the model hub: check your connection"


@dataclass(slots=True)
class RemoteFile:
    name: str
    size: int | None
    etag: str | None = None  # the blob's name in the cache (an LFS file's sha256)


@dataclass(slots=True)
class DownloadProgress:
    done_bytes: int
    total_bytes: int
    file_name: str  # the file being fetched
    files_done: int
    files_total: int


@dataclass(slots=True)
class DownloadResult:
    repo_id: str
    commit: str
    path: Path  # the snapshot folder in the HF cache
    files: list[str]
    total_bytes: int


class DownloadError(Exception):
    """A download failure with a message for the user. kind is one of: offline, not_found,
    gated, no_weights, disk_full, cancelled, failed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class DownloadCancelled(DownloadError):
    def __init__(self) -> None:
        super().__init__("cancelled", "download cancelled")


def select_files(names: list[str], gguf_file: str | None = None) -> list[str]:
    """The files of a repo listing that the app needs, in listing order; [] when the repo
    holds no usable weights (neither safetensors nor the requested .gguf)."""
    top = [n for n in names if "/" not in n]
    if gguf_file is None:
        weights = {n for n in top if fnmatch.fnmatch(n, "*.safetensors")}
        weights |= {n for n in top if n == SAFETENSORS_INDEX} if weights else set()
    else:
        weights = {gguf_file} & set(top)
    if not weights:
        return []
    return [n for n in top if n in weights
            or any(fnmatch.fnmatch(n, p) for p in MODEL_FILE_PATTERNS)]


def list_model_files(repo_id: str, *, revision: str = "main", endpoint: str | None = None,
                     token: str | bool | None = None) -> tuple[str, list[RemoteFile]]:
    """(commit hash, every file of the repo with its size): e.g. to offer a .gguf choice."""
    _check_args(repo_id, None)
    try:
        info = HfApi(endpoint=_endpoint(endpoint), token=token).model_info(
            repo_id, revision=revision, files_metadata=True)
    except Exception as err:
        raise as_download_error(err, repo_id, revision, None) from err
    if not info.sha:
        raise DownloadError("failed", f"the model hub gave no commit for {repo_id}@{revision}")
    return info.sha, [RemoteFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else s.blob_id)
                      for s in info.siblings or []]


def download_model(repo_id: str, *, revision: str = "main", gguf_file: str | None = None,
                   endpoint: str | None = None, cache_dir: Path | str | None = None,
                   token: str | bool | None = None,
                   on_progress: Callable[[DownloadProgress], None] | None = None,
                   cancel: threading.Event | None = None) -> DownloadResult:
    """Fetch the model's files (see module doc) into the HF cache; raises DownloadError.
    endpoint defaults to $HF_ENDPOINT (else huggingface.co), cache_dir to $HF_HUB_CACHE (else
    huggingface_hub's default cache)."""
    _check_args(repo_id, gguf_file)
    endpoint = _endpoint(endpoint)
    cache = Path(cache_dir if cache_dir is not None else _default_cache()).expanduser()
    cancel = cancel if cancel is not None else threading.Event()
    commit, listing = list_model_files(repo_id, revision=revision, endpoint=endpoint,
                                       token=token)
    remote = {f.name: f for f in listing}
    sizes = {f.name: f.size or 0 for f in listing}
    files = select_files(list(sizes), gguf_file)
    if not files:
        what = f"the file {gguf_file}" if gguf_file else "safetensors weights"
        ggufs = [n for n in sizes if n.endswith(".gguf")]
        hint = f" (it has GGUF files: choose one of {', '.join(ggufs)})" if ggufs else ""
        raise DownloadError("no_weights", f"{repo_id} has no {what}{hint}")
    folder = repo_folder_name(repo_id=repo_id, repo_type="model")
    snapshot = cache / folder / "snapshots" / commit
    missing = [n for n in files if not (snapshot / n).exists()]
    tracker = _Tracker(on_progress, cancel, total=sum(sizes[n] for n in files),
                       files_total=len(files))
    tracker.base = tracker.total - sum(sizes[n] for n in missing)
    tracker.files_done = len(files) - len(missing)
    try:
        if missing:
            tracker.check_cancel()
            cache.mkdir(parents=True, exist_ok=True)
            partial = PartialDownload(cache, folder, commit)
            needed = sum(sizes[n] for n in missing) - partial.kept_bytes(missing)
            if _free_bytes(cache) < needed:
                raise OSError(errno.ENOSPC, "not enough free space for the download")
            headers = build_hf_headers(token=token)
            for name in missing:
                tracker.start_file(name)
                url = hf_hub_url(repo_id, name, revision=commit, endpoint=endpoint)
                if partial.fetch(name, url, headers, sizes[name],
                                 functools.partial(_ProgressHook, tracker),
                                 tracker.check_cancel):
                    tracker.advance(sizes[name])  # whole from an earlier try
                tracker.finish_file()
            tracker.check_cancel()
            partial.publish(cache / folder, {n: remote[n].etag for n in missing})
        if revision != commit:
            _write_ref(cache / folder, revision, commit)
    except DownloadError:
        raise
    except Exception as err:
        raise as_download_error(err, repo_id, revision, cache) from err
    tracker.report()
    return DownloadResult(repo_id, commit, snapshot, files, tracker.total)


class _Tracker:
    def __init__(self, on_progress: Callable[[DownloadProgress], None] | None,
                 cancel: threading.Event, total: int, files_total: int) -> None:
        self.on_progress, self.cancel = on_progress, cancel
        self.total, self.files_total = total, files_total
        self.base = 0  # the bytes of the files already whole
        self.file_bytes = 0  # the current file's bytes on disk
        self.files_done = 0
        self.file_name = ""

    @property
    def done(self) -> int:
        return self.base + self.file_bytes

    def start_file(self, name: str) -> None:
        self.check_cancel()
        self.file_name, self.file_bytes = name, 0
        self.report()

    def finish_file(self) -> None:
        self.base, self.file_bytes = self.base + self.file_bytes, 0
        self.files_done += 1

    def resume_at(self, n: int) -> None:
        self.file_bytes = n
        self.report()

    def advance(self, n: int) -> None:
        self.file_bytes += n
        self.report()

    def report(self) -> None:
        if self.on_progress is not None:
            self.on_progress(DownloadProgress(self.done, self.total, self.file_name,
                                              self.files_done, self.files_total))

    def check_cancel(self) -> None:
        if self.cancel.is_set():
            raise DownloadCancelled()


class _ProgressHook:
    """Stands in for tqdm inside huggingface_hub, which reports each chunk through update()
    (a cancel stops the file once the chunk is written: PartialDownload.fetch). ``initial``
    is where a resumed file starts (0 again when the server ignored the range)."""

    def __init__(self, tracker: _Tracker, *args: Any, initial: int = 0, **kwargs: Any) -> None:
        self._tracker = tracker
        tracker.resume_at(int(initial or 0))

    def update(self, n: int | float | None = 1) -> None:
        self._tracker.advance(int(n or 0))

    def __enter__(self) -> _ProgressHook:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __getattr__(self, name: str) -> Callable[..., None]:
        # The rest of tqdm's surface (close, refresh, set_postfix_str, update_transfer, ...)
        # has nothing to report; differs between huggingface_hub versions, hence the catch-all.
        return lambda *args, **kwargs: None


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(ref.name + f".{os.getpid()}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _check_args(repo_id: str, gguf_file: str | None) -> None:
    if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id):
        raise ValueError(f"repo_id must look like 'owner/name', got {repo_id!r}")
    if gguf_file is not None and (not isinstance(gguf_file, str)
                                  or not gguf_file.endswith(".gguf") or "/" in gguf_file):
        raise ValueError(f"gguf_file must be a top-level .gguf file name, got {gguf_file!r}")


def _default_cache() -> str:
    # Like HF_ENDPOINT, HF_HUB_CACHE is read at call time to match engine.loaders.catalog.
    return os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE


def _endpoint(endpoint: str | None) -> str | None:
    # Read at call time: huggingface_hub reads HF_ENDPOINT once, at import.
    return endpoint or os.environ.get("HF_ENDPOINT") or None


def as_download_error(err: Exception, repo_id: str, revision: str,
                       cache: Path | None) -> DownloadError:
    if isinstance(err, DownloadError):
        return err
    if isinstance(err, GatedRepoError):
        return DownloadError("gated", f"{repo_id} is gated: accept its license on the model hub"
                             " and sign in with an access token")
    if isinstance(err, RepositoryNotFoundError):
        return DownloadError("not_found", f"model {repo_id} was not found on the model hub:"
                             " check the name (private models need an access token)")
    if isinstance(err, RevisionNotFoundError):
        return DownloadError("not_found", f"{repo_id} has no revision {revision!r}")
    if isinstance(err, EntryNotFoundError) and not isinstance(err, LocalEntryNotFoundError):
        return DownloadError("not_found", f"a file of {repo_id} is missing on the model hub")
    if isinstance(err, OfflineModeIsEnabled):
        return DownloadError("offline", "downloads are turned off (HF_HUB_OFFLINE is set)")
    if isinstance(err, httpx2.TransportError | LocalEntryNotFoundError):
        # LocalEntryNotFoundError: the hub could not be asked and the private cache is empty.
        return DownloadError("offline", OFFLINE_MESSAGE)
    if isinstance(err, HfHubHTTPError):
        status = err.response.status_code if err.response is not None else "?"
        return DownloadError("failed", f"the model hub answered with an error (HTTP {status}):"
                             " try again later")
    if _has_errno(err, errno.ENOSPC):
        return DownloadError("disk_full", f"not enough disk space in {cache}: free some space"
                             " and try again")
    if isinstance(err, PermissionError):
        return DownloadError("failed", f"cannot write to the model cache {cache}")
    if isinstance(err, OSError):
        return DownloadError("failed", f"download failed: {err}")
    raise err


def _has_errno(err: BaseException | None, code: int) -> bool:
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError) and err.errno == code:
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False
