"""A model's chat template setting: the file's own, the family's turn format, ChatML, or
a pasted Jinja template. Save renders a two-turn chat with the choice first (shown as the
preview) and refuses a template that fails, showing the render error; nothing is kept
until it renders."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from desktop_app.data.model_templates import (
    CHATML,
    FAMILY,
    FILE,
    PASTED,
    ModelTemplate,
    engine_template,
    turn_format_of,
)


class TemplateDialog(QDialog):
    def __init__(self, info, choice: ModelTemplate | None,
                 parent: QWidget | None = None) -> None:
        from engine.text.turn_formats import FORMATS

        super().__init__(parent)
        self.setObjectName("templateDialog")
        self.setWindowTitle(f"Chat template: {info.name}")
        self.turn_format = turn_format_of(info.architecture)
        self.choice: ModelTemplate | None = None  # what Save kept
        label = FORMATS[self.turn_format].label
        own = ("The file's own template" if info.has_chat_template
               else f"The file's (it has none: {label}'s turns)")
        self.choice_box = QComboBox()
        self.choice_box.setObjectName("templateChoice")
        self.choice_box.setAccessibleName("Chat template")
        for text, kind in ((own, FILE), (f"The family's format ({label})", FAMILY),
                           ("ChatML", CHATML), ("A pasted Jinja template", PASTED)):
            self.choice_box.addItem(text, kind)
        self.text_edit = QPlainTextEdit()
        self.text_edit.setObjectName("templateText")
        self.text_edit.setAccessibleName("Pasted Jinja template")
        self.text_edit.setPlaceholderText("{% for message in messages %}…{% endfor %}")
        self.preview = QPlainTextEdit()
        self.preview.setObjectName("templatePreview")
        self.preview.setReadOnly(True)
        self.error_label = QLabel("")
        self.error_label.setObjectName("templateError")
        self.error_label.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save
                                   | QDialogButtonBox.StandardButton.Cancel)
        self.save_button = buttons.button(QDialogButtonBox.StandardButton.Save)
        self.save_button.setObjectName("templateSave")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)

        layout = QVBoxLayout(self)
        layout.addWidget(self.choice_box)
        layout.addWidget(self.text_edit, 2)
        layout.addWidget(QLabel("A two-turn chat as the model will see it:"))
        layout.addWidget(self.preview, 1)
        layout.addWidget(self.error_label)
        layout.addWidget(buttons)

        current = choice or ModelTemplate()
        self.choice_box.setCurrentIndex(self.choice_box.findData(current.kind))
        self.text_edit.setPlainText(current.text)
        self.choice_box.currentIndexChanged.connect(self._on_kind)
        self._on_kind()

    def _on_kind(self) -> None:
        self.text_edit.setEnabled(self.choice_box.currentData() == PASTED)
        self.error_label.setText("")

    def accept(self) -> None:
        """Keep the choice only once it renders a two-turn chat; else show why."""
        from engine.text.turn_formats import check_template

        kind = self.choice_box.currentData()
        try:
            choice = ModelTemplate(kind, self.text_edit.toPlainText() if kind == PASTED
                                   else "")
            template = engine_template(choice, self.turn_format)
            self.preview.setPlainText("" if template is None else check_template(template))
        except ValueError as exc:
            self.error_label.setText(str(exc))
            self.preview.setPlainText("")
            return
        self.choice = choice
        super().accept()
