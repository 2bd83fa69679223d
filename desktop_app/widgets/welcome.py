"""What an empty chat shows: the model replies come from, in plain words, a few example
prompts to start with, and where to find a bigger model.

The window feeds it (`show_model`, `show_loading`) as models load and unload; it says what
the user picks through signals: an example goes into the composer, to read or change
before sending, and "Find a bigger model…" opens the Models dialog.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSizePolicy, QVBoxLayout, QWidget

from desktop_app.widgets.markdown import wrapped_text_policy

EXAMPLES = (
    "Explain what a hash map is, with a short example in Python.",
    "Write a friendly email asking to move Tuesday's meeting to Friday.",
    "Give me three ideas for a rainy weekend with kids.",
    "What are the pros and cons of working from home?",
)
WORDS_PER_TOKEN = 0.75  # English prose, roughly: what "tokens" mean to a reader
NO_MODEL = "No model loaded — pick one in Models…"


@dataclass(slots=True, frozen=True)
class ModelSummary:
    """What the welcome says about a loaded model: its name, how much of a chat it keeps
    in mind (tokens), the memory its weights take (None: not known, a remote model), and
    the server it runs on (None: this computer)."""

    name: str
    context_tokens: int | None
    weight_bytes: int | None = None
    host: str | None = None


def _size(num_bytes: int) -> str:
    if num_bytes >= 2**30:
        return f"{num_bytes / 2**30:.1f} GB"
    return f"{max(1, round(num_bytes / 2**20))} MB"


def model_text(summary: ModelSummary | None) -> str:
    """The welcome's sentence about the model (or about there being none)."""
    if summary is None:
        return NO_MODEL
    where = (f"runs on {summary.host}" if summary.host is not None
             else "runs on this computer")
    parts = [f"You are talking to {summary.name}, which {where}"]
    if summary.weight_bytes:
        parts.append(f" and takes {_size(summary.weight_bytes)} of memory")
    text = "".join(parts) + "."
    if summary.context_tokens:
        words = summary.context_tokens * WORDS_PER_TOKEN
        words = round(words, -2) if words >= 100 else round(words)  # "roughly": no 1,536
        text += (f" It keeps about {summary.context_tokens:,} tokens (roughly "
                 f"{int(words):,} words) of a chat in mind.")
    return text


class WelcomePanel(QWidget):
    """The empty chat's guide (object name "welcome")."""

    promptChosen = Signal(str)  # an example prompt, for the composer
    modelsRequested = Signal()  # "Find a bigger model…"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("welcome")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 32, 24, 24)
        layout.setSpacing(10)
        heading = QLabel("Start a conversation")
        heading.setObjectName("welcomeHeading")
        font = heading.font()
        font.setPointSizeF(font.pointSizeF() * 1.5)
        font.setBold(True)
        heading.setFont(font)
        heading.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(heading)
        self.model_label = QLabel(NO_MODEL)
        self.model_label.setObjectName("welcomeModel")
        self.model_label.setAccessibleName("The model")
        self.model_label.setWordWrap(True)
        self.model_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.model_label.setMaximumWidth(620)  # a paragraph's width, not the column's
        # Centred by stretches, not by an alignment flag: a widget placed by alignment
        # gets its sizeHint, measured at QLabel's own narrow guess of a width, and its
        # wrapped lines were clipped; in a row its height follows its real width.
        self.model_label.setSizePolicy(wrapped_text_policy(QSizePolicy.Policy.Expanding))
        centred = QHBoxLayout()
        centred.addStretch(1)
        centred.addWidget(self.model_label, 100)
        centred.addStretch(1)
        layout.addLayout(centred)
        hint = QLabel("Type a message below, or start from one of these:")
        hint.setObjectName("mutedLabel")
        hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(hint)
        self.example_buttons: list[QPushButton] = []
        for text in EXAMPLES:
            button = QPushButton(text)
            button.setObjectName("examplePrompt")
            button.setToolTip("Put this in the message box")
            button.clicked.connect(lambda _checked=False, t=text: self.promptChosen.emit(t))
            layout.addWidget(button, 0, Qt.AlignmentFlag.AlignHCenter)
            self.example_buttons.append(button)
        bigger = QHBoxLayout()
        bigger.addStretch(1)
        note = QLabel("Small models answer fast but make mistakes; bigger ones know more.")
        note.setObjectName("mutedLabel")
        note.setWordWrap(True)  # a narrow window wraps it rather than scroll sideways
        bigger.addWidget(note, 1)
        self.models_button = QPushButton("Find a bigger model…")
        self.models_button.setObjectName("biggerModelButton")
        self.models_button.setToolTip("Open Models… to download or pick another model")
        self.models_button.clicked.connect(self.modelsRequested)
        bigger.addWidget(self.models_button)
        bigger.addStretch(1)
        layout.addSpacing(8)
        layout.addLayout(bigger)

    def show_model(self, summary: ModelSummary | None) -> None:
        self.model_label.setText(model_text(summary))

    def show_loading(self, name: str, step: str) -> None:
        """A load under way: `step` is load_steps' "Reading the model file… 12%"."""
        self.model_label.setText(f"Loading {name}: {step}")

    def model_text(self) -> str:
        return self.model_label.text()
