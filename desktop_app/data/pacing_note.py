"""What a reply's footer says when its turn found that the remote server runs one request
at a time (``desktop_app/services/remote_pacing.py``), so its candidates ran one after
another: the reply's metrics key, kept with the reply, and the note. Said once, on that
turn: later turns on the server run the same way without it.
"""

from __future__ import annotations

METRIC = "candidates_one_at_a_time"  # RemoteMetrics' field of the same name, in metrics
NOTE = "candidates ran one at a time: the server runs one request at a time"


def pacing_note(metrics: dict | None) -> str:
    """The footer's note for a reply's metrics: "" but on that one turn."""
    # Any stored value is tolerated (an imported chat's metrics may be anything).
    return NOTE if isinstance(metrics, dict) and metrics.get(METRIC) is True else ""
