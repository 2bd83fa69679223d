"""A reply's "Reading your message…" line, kept in step with its stream.

The line lives in the reply's widget (widgets.prompt_progress, a MessageWidget's or each
candidate column's); what it says lives in the ``Stream`` (when the turn was sent, the
engine's last PromptProgress, whether a token came), so a chat drawn again, or opened
again while its prompt is read, shows the line where it was.
"""

from __future__ import annotations

from desktop_app.controllers.stream import Stream


def show_reading(view, stream: Stream | None) -> None:
    """Show ``stream``'s reading on its replies in ``view`` (a ConversationView), or take
    the line away once the reply has started; a beam search's says it is searching."""
    if stream is None:
        return
    for message_id in stream.message_ids:
        line = getattr(view.widget_for(message_id), "prompt_progress", None)
        if line is None:
            continue
        if stream.answering:
            line.finish()
        else:  # a beam search's line stays until its beams come, whole
            line.show_reading(stream.sent_at, stream.reading, stream.beam_width)
