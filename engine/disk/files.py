"""How the disk tier makes its files and folders: private from the start, whole or not at
all.

A block's K/V is the chat it was computed from, as good as the text to anyone who runs the
same model over it, so nothing the tier makes is readable by another user of the machine:
folders are created 0700 and files 0600 by the call that creates them (``mkdir`` and
``os.open`` with that mode; the umask can only remove bits), never chmod'ed after, so
there is no moment where a file holds data under a looser mode. Every missing level of a
folder is made so, the root's missing parents too (``mkdir(parents=True)`` would give
them the default mode): the tier only creates a folder for itself.

A file is written under a temporary name in its folder, then renamed: a reader sees a
whole file or none. The temporary name carries the writer's pid, so a file left by a
writer that was killed (``stale``) can be told from one a live process is writing into
the same folder.
"""

from __future__ import annotations

import os
import secrets
import stat
import time
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
TMP_SUFFIX = ".tmp"
# A temporary file lives for one write; one this old is a killed writer's even if its
# pid is alive again (reused), or where liveness cannot be probed (not POSIX).
STALE_AFTER_S = 600.0


def make_private_dirs(path: Path) -> None:
    """``path`` and each missing level above it, created 0700."""
    missing = []
    level = Path(path)
    while not level.is_dir():
        missing.append(level)
        if level.parent == level:
            break
        level = level.parent
    for level in reversed(missing):
        try:
            level.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:
            if not level.is_dir():
                raise
            # Another writer made it at the same moment (with the same mode).


def temp_path(path: Path, nonce: str, n: int) -> Path:
    """Where ``path`` is written before its rename: hidden, the writer's pid, then the
    writing store's ``nonce`` and a count, so no two writes ever pick the same name."""
    return path.with_name(f".{path.name}.{os.getpid()}.{nonce}.{n}{TMP_SUFFIX}")


def new_nonce() -> str:
    return secrets.token_hex(4)


def create_private(path: Path, *chunks: bytes) -> None:
    """A new file ``path`` (it must not exist), 0600 from its first byte, holding the
    ``chunks``; nothing left there if it fails (the error is raised)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                 PRIVATE_FILE)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
    except BaseException:
        _remove(path)
        raise


def write_private(path: Path, tmp: Path, *chunks: bytes) -> None:
    """The ``chunks`` as the file ``path``, written whole as ``tmp`` (`create_private`)
    then renamed over it; nothing left under ``tmp`` if it fails (the error is raised)."""
    create_private(tmp, *chunks)
    try:
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


def stale(name: str, mtime_s: float, now_s: float | None = None) -> bool:
    """Whether the temporary file ``name`` (of ``temp_path``'s form) was left by a writer
    that is gone: its pid is not running, or it is older than any write takes."""
    now_s = time.time() if now_s is None else now_s
    if now_s - mtime_s > STALE_AFTER_S:
        return True
    parts = name[:-len(TMP_SUFFIX)].split(".")
    pid = parts[-3] if len(parts) >= 4 else ""
    if os.name != "posix" or not pid.isdigit():
        return False  # young and not ours to judge: leave it for the age rule
    if int(pid) == os.getpid():
        return False  # another store of this process may be writing it
    try:
        os.kill(int(pid), 0)  # a liveness probe on POSIX (it sends nothing)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, another user's
    return False


def tighten(path: Path, st: os.stat_result, mode: int) -> None:
    """Chmod a folder or file an older Folio made with a looser mode to ``mode``, if this
    user owns it (another's is left as it is). ``st`` of a link (``lstat``) is left: a
    chmod would change whatever it points to, maybe outside the tier."""
    if (os.name != "posix" or stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077
            or st.st_uid != os.getuid()):
        return
    try:
        os.chmod(path, mode)
    except OSError:
        pass
