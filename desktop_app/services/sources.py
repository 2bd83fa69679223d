"""Model sources as the window names them: the starter, local folders and .gguf files, and
remote servers (``remote:<base_url>#<model>``, see desktop_app.data.servers)."""

from __future__ import annotations

from desktop_app.data.servers import host_of, is_remote_source, parse_server_source

STARTER = "starter"


def display_name(source: str) -> str:
    if source == STARTER:
        return "SmolLM2-135M-Instruct (built in)"
    if is_remote_source(source):
        base_url, model = parse_server_source(source)
        return f"{model} @ {host_of(base_url)}"
    return source.rstrip("/").rsplit("/", 1)[-1] or source


def picker_sources(settings, current: str | None) -> list[str]:
    """What the toolbar's model picker offers: the starter, the remembered local models,
    the added servers, and whatever is loaded now (first, if it is none of those)."""
    sources = [STARTER] + [p for p in settings.model_paths if p != STARTER]
    sources += [s.source for s in settings.servers if s.source not in sources]
    if current and current not in sources:
        sources.insert(0, current)
    return sources


def load_failure_text(source: str, message: str, still: str) -> str:
    """The error dialog's text when ``source`` did not load (``still``: what runs now)."""
    name = display_name(source)
    if is_remote_source(source):
        advice = ("Check that the server is running and that its URL and API key are "
                  "right (add it again from the model manager to change them), then load "
                  "it again.")
    else:
        advice = ("Check that the folder holds config.json, a tokenizer and .safetensors "
                  "weights (or pick a .gguf file), then load it again from the model "
                  "manager.")
    return f"{name} did not load:\n\n{message}\n\n{still} {advice}"


def register_remembered_keys(bridge, settings) -> None:
    """Hand the bridge the API keys kept in the settings (the others live for a session)."""
    for server in settings.servers:
        if server.api_key:
            bridge.set_server_key(server.source, server.api_key)
