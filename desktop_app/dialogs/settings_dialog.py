"""The settings dialog: this chat's sampling settings, the defaults for new chats, the
switch that serves the loaded model to other programs on this machine, the engine's
device, weights, memory for chats, KV cache precision (dialogs.kv_precision_box) and the
embedding model for documents (dialogs.embedding_box), and the MCP servers
(dialogs.tools_settings)."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from desktop_app.data.beam_choice import SAMPLING_ONLY, SAMPLING_ONLY_NOTE
from desktop_app.data.context_policy import POLICIES, POLICY_LABELS
from desktop_app.data.engine_settings import (
    CPU_PRECISION_LABELS,
    MAX_CHAT_MEMORY_MIB,
    MAX_WARM_DISK_GIB,
    WEIGHT_LABELS,
    EngineSettings,
)
from desktop_app.data.kv_precision import ModelShape
from desktop_app.data.settings import MAX_CANDIDATES, THEMES, ChatSettings
from desktop_app.dialogs.beam_box import BeamBox
from desktop_app.dialogs.embedding_box import EmbeddingBox
from desktop_app.dialogs.kv_precision_box import KVPrecisionBox
from desktop_app.dialogs.speed_box import SpeedBox
from desktop_app.dialogs.tools_settings import ToolsSettingsPage
from desktop_app.services.devices import cuda_device_names, device_choices
from desktop_app.widgets.dialog_parts import error_label, ok_cancel
from engine.runner.kv_cache import CONCURRENT_CONTEXTS, DEFAULT_KV_BUDGET_BYTES

MAX_SEED = 2**31 - 1
NO_LIMIT = "Up to the context"  # the max tokens box at 0: ChatSettings.max_tokens None


def _double(lo: float, hi: float, step: float, decimals: int = 2) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(lo, hi)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    return box


def _int(lo: int, hi: int) -> QSpinBox:
    box = QSpinBox()
    box.setRange(lo, hi)
    return box


def _choice(name: str, label: str, tip: str, items: list[tuple[str, object]]) -> QComboBox:
    """A combo box named `name` (its objectName) offering (text, value) items."""
    box = QComboBox()
    box.setObjectName(name)
    box.setAccessibleName(label)
    box.setToolTip(tip)
    for text, value in items:
        box.addItem(text, value)
    return box


class ChatSettingsForm(QWidget):
    """Edits one ChatSettings; `settings()` raises ValueError naming a bad field."""

    def __init__(self, settings: ChatSettings, max_tokens_limit: int = 32768,
                 parent: QWidget | None = None, beam_refusal: str | None = None) -> None:
        super().__init__(parent)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setObjectName("systemPrompt")
        self.system_prompt.setPlaceholderText("e.g. You are a concise assistant.")
        self.system_prompt.setFixedHeight(90)
        self.temperature = _double(0.0, 5.0, 0.05)
        self.temperature.setToolTip("0 = greedy: always the most likely token")
        self.top_p = _double(0.01, 1.0, 0.01)
        self.top_k = _int(0, 100000)
        self.top_k.setToolTip("0 turns top-k off")
        self.min_p = _double(0.0, 1.0, 0.01)
        self.repetition_penalty = _double(0.01, 5.0, 0.05)
        self.repetition_penalty.setToolTip("1 turns it off")
        self.max_tokens = _int(0, max_tokens_limit)
        self.max_tokens.setObjectName("maxTokens")
        self.max_tokens.setSpecialValueText(NO_LIMIT)
        self.max_tokens.setToolTip("0 lets a reply run to the end of the model's context; "
                                   "a cut-off reply can be continued")
        self.fixed_seed = QCheckBox("Fixed seed")
        self.seed = _int(0, MAX_SEED)
        self.fixed_seed.toggled.connect(self.seed.setEnabled)
        self.num_candidates = _int(1, MAX_CANDIDATES)
        self.num_candidates.setToolTip("Replies generated side by side for each message")
        self.overflow_policy = QComboBox()
        self.overflow_policy.setObjectName("overflowPolicy")
        self.overflow_policy.setToolTip("What is sent once the chat is longer than the "
                                        "model's context (the saved chat stays whole)")
        for policy in POLICIES:
            self.overflow_policy.addItem(POLICY_LABELS[policy], policy)
        # Beam search (``beam_refusal``: why the loaded model runs none); the settings
        # only sampling reads are greyed out while it is on, their tooltips saying why.
        self.beam = BeamBox(self)
        self.beam.set_refusal(beam_refusal)
        self._tips = {name: getattr(self, name).toolTip() for name in SAMPLING_ONLY
                      if name != "seed"}
        self._tips["fixed_seed"] = self.fixed_seed.toolTip()
        self.beam.toggled.connect(self._grey_sampling)

        seed_row = QHBoxLayout()
        seed_row.addWidget(self.fixed_seed)
        seed_row.addWidget(self.seed, 1)
        form = QFormLayout(self)
        form.addRow("System prompt", self.system_prompt)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form.addRow("Min-p", self.min_p)
        form.addRow("Repetition penalty", self.repetition_penalty)
        form.addRow("Max tokens", self.max_tokens)
        form.addRow("Seed", seed_row)
        form.addRow("Candidates", self.num_candidates)
        for label, widget in self.beam.rows():
            form.addRow(label, widget)
        form.addRow("When the context is full", self.overflow_policy)
        self.set_settings(settings)

    def set_settings(self, s: ChatSettings) -> None:
        self._base = s  # what the form does not show (tools, JSON mode...) is kept
        self.system_prompt.setPlainText(s.system_prompt)
        self.temperature.setValue(s.temperature)
        self.top_p.setValue(s.top_p)
        self.top_k.setValue(s.top_k)
        self.min_p.setValue(s.min_p)
        self.repetition_penalty.setValue(s.repetition_penalty)
        self.max_tokens.setValue(s.max_tokens or 0)
        self.fixed_seed.setChecked(s.seed is not None)
        self.seed.setEnabled(s.seed is not None)
        self.seed.setValue(s.seed or 0)
        self.num_candidates.setValue(s.num_candidates)
        self.overflow_policy.setCurrentIndex(max(0, self.overflow_policy.findData(
            s.overflow_policy)))
        self.beam.set_values(s.beam_search, s.beam_width, s.length_penalty)

    def _grey_sampling(self, beam: bool) -> None:
        for name, tip in self._tips.items():
            box = getattr(self, name)
            box.setEnabled(not beam)
            box.setToolTip(SAMPLING_ONLY_NOTE if beam else tip)
        self.seed.setEnabled(not beam and self.fixed_seed.isChecked())
        self.seed.setToolTip(SAMPLING_ONLY_NOTE if beam else "")

    def settings(self) -> ChatSettings:
        beam, width, penalty = self.beam.value()
        return replace(
            self._base,
            system_prompt=self.system_prompt.toPlainText().strip(),
            temperature=round(self.temperature.value(), 4),
            top_p=round(self.top_p.value(), 4),
            top_k=self.top_k.value(),
            min_p=round(self.min_p.value(), 4),
            repetition_penalty=round(self.repetition_penalty.value(), 4),
            max_tokens=self.max_tokens.value() or None,
            seed=self.seed.value() if self.fixed_seed.isChecked() else None,
            num_candidates=self.num_candidates.value(),
            overflow_policy=self.overflow_policy.currentData(),
            beam_search=beam,
            beam_width=width,
            length_penalty=penalty,
        )


class ServeForm(QWidget):
    """The "Serve the loaded model on localhost:PORT" switch and its port."""

    def __init__(self, enabled: bool, port: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.enabled = QCheckBox()
        self.enabled.setObjectName("serveSetting")
        self.enabled.setAccessibleName("Serve the loaded model")
        self.port = _int(1, 65535)
        self.port.setObjectName("servePort")
        self.port.setAccessibleName("Port to serve on")
        self.port.valueChanged.connect(self._label)
        note = QLabel("Other programs on this computer (scripts, editors, the openai "
                      "client) can then use the loaded model through an OpenAI-compatible "
                      "API. Only this machine can reach it (127.0.0.1). API requests "
                      "share the model and its KV cache with your chats and show in the "
                      "memory panel's block map as \"API request\".")
        note.setObjectName("mutedLabel")
        note.setWordWrap(True)
        form = QFormLayout(self)
        form.addRow(self.enabled)
        form.addRow("Port", self.port)
        form.addRow(note)
        self.enabled.setChecked(enabled)
        self.port.setValue(port)
        self._label(port)

    def _label(self, port: int) -> None:
        self.enabled.setText(f"Serve the loaded model on localhost:{port}")
        self.enabled.setToolTip(f"Clients use http://127.0.0.1:{port}/v1 as the base URL")

    def value(self) -> tuple[bool, int]:
        return self.enabled.isChecked(), self.port.value()


class EngineForm(QWidget):
    """Device, weights, CPU precision, memory for chats and KV cache precision (each choice
    with the tokens it holds for `model`, the loaded model's shape); `settings()` raises
    ValueError naming a bad field. Applying a change reloads the model
    (EngineBridge.apply_engine_settings)."""

    def __init__(self, settings: EngineSettings, cuda_names: list[str] | None = None,
                 parent: QWidget | None = None, model: ModelShape | None = None,
                 mtp_missing: str | None = "no model is loaded") -> None:
        super().__init__(parent)
        cuda_names = cuda_device_names() if cuda_names is None else cuda_names
        self.device = _choice("deviceSetting", "Device",
                              "Auto uses the first GPU when there is one, else the CPU",
                              device_choices(cuda_names))
        if self.device.findData(settings.device) < 0:  # kept, not silently changed
            self.device.addItem(f"{settings.device} (not found on this computer)",
                                settings.device)
        self.weights = _choice(
            "weightsSetting", "Weights",
            "As stored: quantized GGUF weights stay quantized (least memory). bfloat16 / "
            "float32: dense weights in that type; float32 is the exact path and the most "
            "memory.", [(label, value) for value, label in WEIGHT_LABELS.items()])
        self.cpu_precision = _choice(
            "cpuPrecisionSetting", "CPU precision",
            "Quantized models on the CPU. Exact: the same tokens as float32 weights. Fast: "
            "replies 10-20% faster (and short prompts on CPUs without AVX-512), as "
            "llama.cpp computes; a few tokens differ.",
            [(label, value) for value, label in CPU_PRECISION_LABELS.items()])
        self.chat_memory = _int(0, MAX_CHAT_MEMORY_MIB)
        self.chat_memory.setObjectName("chatMemorySetting")
        self.chat_memory.setAccessibleName("Memory for chats")
        self.chat_memory.setSpecialValueText("Automatic")  # shown for 0
        self.chat_memory.setSuffix(" MiB")
        self.chat_memory.setSingleStep(256)
        self.keep_warm = QCheckBox("Keep chats warm on disk")
        self.keep_warm.setObjectName("keepWarmSetting")
        self.keep_warm.setToolTip("A chat's KV cache is kept on disk when it leaves memory or "
                                  "the model unloads, so the chat reopens without "
                                  "recomputing its history")
        self.warm_disk = _int(1, MAX_WARM_DISK_GIB)
        self.warm_disk.setObjectName("warmDiskSetting")
        self.warm_disk.setAccessibleName("Disk for warm chats")
        self.warm_disk.setSuffix(" GiB")
        self.keep_warm.toggled.connect(self.warm_disk.setEnabled)
        self.kv_precision = KVPrecisionBox(settings.kv_cache_dtype, model, bool(cuda_names))
        self.speed = SpeedBox(settings.speculative, mtp_missing=mtp_missing)
        self.embedding_error = error_label("embeddingModelError")
        self.embedding = EmbeddingBox(settings.embedding_model, self._embedding_message)
        self.device.currentIndexChanged.connect(
            lambda _i: self.kv_precision.set_device(self.device.currentData()))
        self.chat_memory.valueChanged.connect(self.kv_precision.set_budget)
        held = ("Each precision shows the tokens of context it holds for the loaded model "
                "in the memory for chats. " if model is not None else "")
        note = QLabel(f"Memory for chats is the KV cache: what the model remembers of every "
                      f"open conversation. Automatic: {CONCURRENT_CONTEXTS} full contexts of "
                      f"the loaded model, at most {DEFAULT_KV_BUDGET_BYTES >> 30} GiB but "
                      f"never less than one context. Less than one full context cannot load "
                      f"the model. {held}Changing any of these reloads the model.")
        note.setObjectName("mutedLabel")
        note.setWordWrap(True)
        form = QFormLayout(self)
        form.addRow("Device", self.device)
        form.addRow("Weights", self.weights)
        form.addRow("CPU precision", self.cpu_precision)
        form.addRow("Memory for chats", self.chat_memory)
        form.addRow("KV cache precision", self.kv_precision)
        form.addRow("Speed", self.speed)
        form.addRow("Embedding model for documents", self.embedding)
        form.addRow(self.embedding_error)
        form.addRow(self.keep_warm)
        form.addRow("Disk for warm chats", self.warm_disk)
        form.addRow(note)
        self.device.setCurrentIndex(self.device.findData(settings.device))
        self.weights.setCurrentIndex(max(0, self.weights.findData(settings.weights)))
        self.cpu_precision.setCurrentIndex(
            max(0, self.cpu_precision.findData(settings.cpu_activation_bits)))
        self.chat_memory.setValue(settings.chat_memory_mib or 0)
        self.keep_warm.setChecked(settings.keep_warm_on_disk)
        self.warm_disk.setValue(settings.warm_disk_gib)
        self.warm_disk.setEnabled(settings.keep_warm_on_disk)
        self.kv_precision.set_device(settings.device)
        self.kv_precision.set_budget(settings.chat_memory_mib or 0)

    def settings(self) -> EngineSettings:
        mib = self.chat_memory.value()
        return EngineSettings(device=self.device.currentData(),
                              weights=self.weights.currentData(),
                              chat_memory_mib=mib or None,
                              cpu_activation_bits=self.cpu_precision.currentData(),
                              keep_warm_on_disk=self.keep_warm.isChecked(),
                              warm_disk_gib=self.warm_disk.value(),
                              kv_cache_dtype=self.kv_precision.value(),
                              speculative=self.speed.value(),
                              embedding_model=self.embedding.value())

    def _embedding_message(self, text: str) -> None:
        self.embedding_error.setText(text)
        self.embedding_error.setVisible(bool(text))


THEME_LABELS = {"system": "System", "light": "Light", "dark": "Dark"}


class SettingsDialog(QDialog):
    """Tabs: the open chat (absent when none is open), the new-chat defaults, serving, the
    engine (when `engine` is given; `model`: the loaded local model's shape, for what each
    KV cache precision holds; `mtp_missing`: why it has no MTP head to draft with, None
    when it has one); under them the app's theme (System / Light / Dark)."""

    def __init__(self, chat_settings: ChatSettings | None, defaults: ChatSettings,
                 max_tokens_limit: int = 32768, parent: QWidget | None = None,
                 serve: tuple[bool, int] = (False, 8000), theme: str = "system",
                 engine: EngineSettings | None = None,
                 cuda_names: list[str] | None = None, tools=None,
                 model: ModelShape | None = None,
                 mtp_missing: str | None = "no model is loaded",
                 beam_refusal: str | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("settingsDialog")
        self.setWindowTitle("Settings")
        self.setMinimumWidth(460)
        self.tabs = QTabWidget()
        self.chat_form = None
        if chat_settings is not None:
            self.chat_form = ChatSettingsForm(chat_settings, max_tokens_limit,
                                              beam_refusal=beam_refusal)
            self.tabs.addTab(self.chat_form, "This chat")
        self.defaults_form = ChatSettingsForm(defaults, max_tokens_limit,
                                              beam_refusal=beam_refusal)
        self.tabs.addTab(self.defaults_form, "Defaults for new chats")
        self.serve_form = ServeForm(*serve)
        self.tabs.addTab(self.serve_form, "Serving")
        self.engine_form = None
        if engine is not None:
            self.engine_form = EngineForm(engine, cuda_names, model=model,
                                          mtp_missing=mtp_missing)
            self.tabs.addTab(self.engine_form, "Engine")
        self.tools_page = None
        if tools is not None:  # a ToolsBridge: Settings ▸ Tools, the MCP servers
            self.tools_page = ToolsSettingsPage(tools)
            self.tabs.addTab(self.tools_page, "Tools")
        self.theme = QComboBox()
        self.theme.setObjectName("themeSetting")
        self.theme.setAccessibleName("Theme")
        self.theme.setToolTip("System follows the desktop's light or dark setting")
        for value in THEMES:
            self.theme.addItem(THEME_LABELS[value], value)
        self.theme.setCurrentIndex(max(0, self.theme.findData(theme)))
        theme_row = QFormLayout()
        theme_row.addRow("Theme", self.theme)
        self.error_label = error_label("settingsError")
        buttons = ok_cancel(self)
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)
        layout.addLayout(theme_row)
        layout.addWidget(self.error_label)
        layout.addWidget(buttons)
        self.result_chat: ChatSettings | None = None
        self.result_defaults: ChatSettings | None = None
        self.result_serve: tuple[bool, int] | None = None
        self.result_theme: str | None = None
        self.result_engine: EngineSettings | None = None

    def accept(self) -> None:
        try:
            chat = self.chat_form.settings() if self.chat_form is not None else None
            defaults = self.defaults_form.settings()
            engine = self.engine_form.settings() if self.engine_form is not None else None
        except ValueError as exc:
            # Spin box ranges make this rare; say which field is wrong and stay open.
            self.error_label.setText(str(exc))
            self.error_label.setVisible(True)
            return
        self.result_chat, self.result_defaults = chat, defaults
        self.result_serve = self.serve_form.value()
        self.result_theme = self.theme.currentData()
        self.result_engine = engine
        super().accept()
