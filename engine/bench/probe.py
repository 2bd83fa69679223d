"""Measurements that need a process of their own: peak memory (a process's high-water mark
only ever grows, so each side needs a fresh one) and loads that might not fit in memory (a
load the kernel kills for memory must not take the bench down with it).

``run_probe("engine.bench.memory:chat_peak_rss", {...})`` starts ``python -c`` importing that
function, calls it with the keyword arguments, and collects what it reports. A probe reports
through ``emit(dict)``, which prints one marked JSON line; the parent merges every line it
sees, so a probe that is killed or runs out of time still hands back what it had measured
(the load time, say, before a decode that never finished).

This module imports neither torch nor the engine: a llama.cpp probe's peak is llama.cpp's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

MARK = "@@folio-probe@@ "

_CHILD = """
import json, sys
module, _, name = sys.argv[1].partition(":")
func = getattr(__import__(module, fromlist=[name]), name)
func(**json.loads(sys.argv[2]))
"""


def emit(values: dict) -> None:
    """Report ``values`` to the parent (call from inside a probe)."""
    print(MARK + json.dumps(values), flush=True)


def peak_rss_bytes(status_path: str = "/proc/self/status") -> int | None:
    """This process's peak resident set (VmHWM) in bytes; None where /proc has no such line
    (not Linux)."""
    try:
        with open(status_path) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    value, unit = line.split()[1:3]
                    return int(value) * {"kB": 1024, "mB": 1024**2}.get(unit, 1)
    except OSError:
        return None
    return None


def parse_reports(stdout: str | bytes | None) -> dict:
    """Every ``emit``-ted dict in ``stdout``, later keys winning."""
    if isinstance(stdout, bytes):
        stdout = stdout.decode("utf-8", errors="replace")
    merged: dict = {}
    for line in (stdout or "").splitlines():
        if line.startswith(MARK):
            merged.update(json.loads(line[len(MARK):]))
    return merged


def run_probe(target: str, kwargs: dict, timeout_s: float, python: str | None = None) -> dict:
    """Run ``module:function(**kwargs)`` in a fresh interpreter (``python``, this one by
    default; another finds this checkout through PYTHONPATH); its reports, plus ``error``
    when it failed, was killed or ran past ``timeout_s``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if python is not None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run([python or sys.executable, "-c", _CHILD, target,
                               json.dumps(kwargs)],
                              capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as exc:
        result = parse_reports(exc.stdout)
        result["error"] = f"ran past its {timeout_s:g} s limit"
        return result
    result = parse_reports(proc.stdout)
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        why = " (out of memory?)" if proc.returncode == -signal.SIGKILL else ""
        result["error"] = f"killed by {name}{why}"
    elif proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no message"]
        result["error"] = f"exit status {proc.returncode}: {tail[0][:300]}"
    return result
