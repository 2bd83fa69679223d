"""The first screen through the real window: the Memory dock closed on a first run and
remembered open, the empty chat's welcome (the model, examples, a bigger model), and a
load told in plain steps with one percentage."""

from __future__ import annotations

from PySide6.QtCore import Qt

from desktop_app.data.settings import load_settings
from desktop_app.services import sources
from desktop_app.services.engine_bridge import EngineBridge
from desktop_app.widgets.load_steps import STEPS, UNKNOWN_STEP, plain_step
from desktop_app.widgets.welcome import EXAMPLES, NO_MODEL, ModelSummary, model_text

ENGINE_STAGES = ("config", "open", "tokenizer", "index", "cache", "weights",
                 "building the model", "warming up", "ready")


def test_the_memory_dock_is_closed_on_a_first_run_and_then_as_it_was_left(
        qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge, load_settings())  # no saved layout: a first run
    assert window.vram_dock.isHidden() and not window.vram_action.isChecked()
    assert not window.vram_panel.isVisible()
    window.vram_action.trigger()  # the toolbar's Memory button
    assert window.vram_dock.isVisible() and window.vram_panel.isVisible()
    window.close()
    saved = load_settings()
    assert saved.dock_state
    again = make_window(fake_bridge, saved)
    assert again.vram_dock.isVisible() and again.vram_action.isChecked()
    again.vram_action.trigger()  # closed again: it stays closed next time
    again.close()
    third = make_window(fake_bridge, load_settings())
    assert third.vram_dock.isHidden()


def test_an_empty_chat_shows_the_model_examples_and_where_to_get_a_bigger_one(
        qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge, load_settings())
    welcome = window.conversation.welcome
    assert welcome.isVisible()
    text = welcome.model_text()
    assert text.startswith(f"You are talking to {sources.display_name('starter')}, "
                           "which runs on this computer and takes 500 MB of memory.")
    assert "about 2,048 tokens (roughly 1,500 words)" in text  # the fake's context
    for width in (1600, 900):  # the sentence wraps and none of its lines is clipped
        window.resize(width, 800)
        qtbot.waitUntil(lambda: welcome.model_label.height() >= welcome.model_label
                        .heightForWidth(welcome.model_label.width()) > 20, timeout=2000)
        assert welcome.width() <= window.conversation.scroll.viewport().width()
    assert [b.text() for b in welcome.example_buttons] == list(EXAMPLES)
    qtbot.mouseClick(welcome.example_buttons[1], Qt.MouseButton.LeftButton)
    assert window.conversation.composer.toPlainText() == EXAMPLES[1]
    assert window.conversation.composer.hasFocus()
    qtbot.mouseClick(welcome.models_button, Qt.MouseButton.LeftButton)
    assert window.model_manager.isVisible()
    window.model_manager.close()
    with qtbot.waitSignal(window.controller.turnFinished, timeout=10_000):
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
    assert not welcome.isVisible()  # the chat has messages now
    window.new_chat()
    assert welcome.isVisible()
    with qtbot.waitSignal(fake_bridge.modelUnloaded, timeout=5000):
        fake_bridge.unload_model()
    assert welcome.model_text() == NO_MODEL


def test_the_welcome_speaks_of_a_remote_model_and_of_none():
    assert model_text(None) == NO_MODEL
    remote = ModelSummary("qwen3-32b", 32768, None, "gpu-box:8000")
    assert model_text(remote) == (
        "You are talking to qwen3-32b, which runs on gpu-box:8000. It keeps about 32,768 "
        "tokens (roughly 24,600 words) of a chat in mind.")
    tiny = ModelSummary("tiny", 64, 3 * 2**20)
    assert model_text(tiny) == ("You are talking to tiny, which runs on this computer and "
                                "takes 3 MB of memory. It keeps about 64 tokens (roughly 48 "
                                "words) of a chat in mind.")
    big = ModelSummary("Llama-3.1-8B", None, 5 * 2**30)
    assert model_text(big) == ("You are talking to Llama-3.1-8B, which runs on this "
                               "computer and takes 5.0 GB of memory.")


def test_every_stage_the_engine_reports_has_plain_words(tiny_model_path):
    from engine import LLM, EngineConfig

    heard: list[str] = []
    LLM(str(tiny_model_path), config=EngineConfig(num_gpu_blocks=16, max_model_len=64,
                                                 block_size=16),
        progress=lambda stage, fraction: heard.append(stage))
    assert {"config", "weights", "ready"} <= set(heard)  # warming up: when the config asks
    assert set(heard) <= set(ENGINE_STAGES) <= set(STEPS)
    for stage in ENGINE_STAGES:
        words, percent = plain_step(stage, 0.5)
        assert words != UNKNOWN_STEP and words[0].isupper()
        assert words.endswith("…")
        assert 0 <= percent <= 100
    assert plain_step("connecting to gpu-box:8000", 0.2) == ("Connecting to gpu-box:8000…", 18)


def test_a_load_shows_plain_steps_and_a_percentage_that_never_goes_back(
        qtbot, make_window, fake_engine):
    fake_llm, fake_worker = fake_engine

    def factory(source, config=None, progress=None):
        # A GGUF file's order: its cache is read before the vocabulary.
        for stage, fraction in (("open", 0.0), ("cache", 0.0), ("cache", 1.0),
                                ("open", 1.0), ("tokenizer", 0.0), ("tokenizer", 1.0),
                                ("weights", 0.0), ("weights", 0.5), ("weights", 1.0),
                                ("building the model", 0.0), ("warming up", 0.0),
                                ("ready", 1.0)):
            progress(stage, fraction)
        return fake_llm(name="tiny.gguf")

    bridge = EngineBridge(llm_factory=factory, worker_factory=fake_worker)
    window = make_window(bridge, load_settings())
    shown: list[tuple[str, int, str, str]] = []
    bridge.loadProgress.connect(lambda *_: shown.append((
        window.load_progress.format(), window.load_progress.value(),
        window.statusBar().currentMessage(), window.conversation.welcome.model_text())))
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        window.load_model("/models/tiny.gguf")
    percents = [value for _, value, _, _ in shown]
    assert percents == sorted(percents) and percents[-1] == 100
    formats = [fmt for fmt, _, _, _ in shown]
    assert formats[0] == "Reading the model file… %p%"
    assert {"Loading the model into memory… %p%", "Preparing… %p%",
            "Warming up… %p%"} <= set(formats)
    assert shown[7][2] == "Loading tiny.gguf: Loading the model into memory… 48%"
    assert shown[7][3] == "Loading tiny.gguf: Loading the model into memory… 48%"
    for fmt, _, status, welcome in shown:  # no stage name of the engine's on screen
        for text in (fmt, status, welcome):
            assert not any(f"{stage} " in text or f": {stage}" in text
                           for stage in ("open", "cache", "tokenizer", "weights"))
    assert window.conversation.welcome.model_text().startswith(
        "You are talking to tiny.gguf")
    bridge.shutdown()
