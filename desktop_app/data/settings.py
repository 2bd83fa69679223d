"""App settings and per-chat sampling settings, saved as JSON (no Qt here).

Usage from the GUI::

    settings = load_settings()                 # never raises on a bad file
    settings.chat_defaults.temperature         # defaults for new chats
    settings.remember_model_path("/models/x.gguf")
    settings.window_geometry = bytes(win.saveGeometry().toBase64()).decode()
    save_settings(settings)                    # atomic: temp file + os.replace

    params = chat.settings.to_sampling_params()   # engine SamplingParams, n = num_candidates

The file lives at ``settings_path()``: ``platformdirs.user_config_dir("folio")/settings.json``,
or ``$FOLIO_CONFIG_DIR/settings.json`` when that variable is set.

Max tokens: None (the default) lets a reply run to the end of the model's context. The
old default, 512, cut long answers off; a file or chat saved before this change (settings
version 1, chats database version 3) reads a stored 512 as that old default, not as a
choice, and gets None. A 512 chosen since stays 512.

A file that is not valid JSON falls back to all defaults; a field with a bad value falls back
to that field's default. Either way the original file is kept next to it as
``settings.json.bak`` so nothing the user wrote is lost.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs

from desktop_app.data import json_mode
from desktop_app.data.context_policy import DEFAULT_POLICY, POLICIES
from desktop_app.data.engine_settings import EngineSettings
from desktop_app.data.model_templates import ModelTemplate
from desktop_app.data.servers import ServerEntry
from engine.text.reasoning.options import REASONING_EFFORTS

if TYPE_CHECKING:
    from engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

SETTINGS_FILE = "settings.json"
THEMES = ("system", "light", "dark")
MAX_CANDIDATES = 4
MIN_BEAM_WIDTH, MAX_BEAM_WIDTH = 2, 8  # each beam is a column of the reply
MAX_LENGTH_PENALTY = 5.0
SETTINGS_VERSION = 2  # 2: max_tokens None is "up to the context"
OLD_DEFAULT_MAX_TOKENS = 512  # the default before version 2 (see the module doc)


@dataclass(slots=True)
class ChatSettings:
    """Sampling settings of one chat (and, in AppSettings, the defaults for new chats)."""

    system_prompt: str = ""
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repetition_penalty: float = 1.1
    # None: up to the context (the model's context minus the prompt).
    max_tokens: int | None = None
    seed: int | None = None
    num_candidates: int = 1
    # What is sent once the chat outgrows the model's context (data.context_policy):
    # "keep_latest", "truncate_middle" or "stop". The stored chat is never shortened.
    overflow_policy: str = DEFAULT_POLICY
    # The MCP tools the model may call in this chat, by server name: None for all of the
    # server's tools, else the names chosen (mcp.toolset). Absent: the server is off.
    tools: dict[str, list[str] | None] = field(default_factory=dict)
    # "Answer in JSON" (data.json_mode): the reply constrained to a JSON object, or to the
    # schema in json_schema's text when it is not blank.
    json_mode: bool = False
    json_schema: str = ""
    # "Think": a reasoning model whose template has the switch (``enable_thinking``)
    # thinks before it answers; off, it answers at once. Other models ignore it.
    think: bool = True
    # "Reasoning effort": low, medium or high for a model whose template reads
    # ``reasoning_effort`` (gpt-oss); None leaves the template's default. Others ignore it.
    reasoning_effort: str | None = None
    # "Compare with": the local models (sources, as the model picker names them) that answer
    # each turn beside the picker's model, a column each (controllers.compare_turns).
    compare_models: list[str] = field(default_factory=list)
    # "Beam search" (data.beam_choice): each reply a deterministic beam search of this
    # width, its finished beams shown as the candidates, best first.
    beam_search: bool = False
    beam_width: int = 4
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        check = _checker("ChatSettings")
        check(isinstance(self.system_prompt, str), "system_prompt", self.system_prompt,
              "a string")
        check(_is_number(self.temperature) and 0 <= self.temperature <= 5, "temperature",
              self.temperature, "a number in [0, 5]")
        check(_is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", self.top_p,
              "a number in (0, 1]")
        check(_is_int(self.top_k) and self.top_k >= 0, "top_k", self.top_k,
              "an integer >= 0 (0 turns it off)")
        check(_is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", self.min_p,
              "a number in [0, 1]")
        check(_is_number(self.repetition_penalty) and 0 < self.repetition_penalty <= 5,
              "repetition_penalty", self.repetition_penalty, "a number in (0, 5]")
        check(self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
              "max_tokens", self.max_tokens, "an integer >= 1 or null (up to the context)")
        check(self.seed is None or (_is_int(self.seed) and self.seed >= 0), "seed", self.seed,
              "an integer >= 0 or None")
        check(_is_int(self.num_candidates) and 1 <= self.num_candidates <= MAX_CANDIDATES,
              "num_candidates", self.num_candidates, f"an integer in [1, {MAX_CANDIDATES}]")
        check(self.overflow_policy in POLICIES, "overflow_policy", self.overflow_policy,
              f"one of {', '.join(POLICIES)}")
        check(isinstance(self.tools, dict) and all(
            isinstance(k, str) and (v is None or (isinstance(v, list) and all(
                isinstance(n, str) for n in v))) for k, v in self.tools.items()),
            "tools", self.tools, "an object of server names to null or lists of tool names")
        check(isinstance(self.json_mode, bool), "json_mode", self.json_mode, "true or false")
        check(isinstance(self.json_schema, str), "json_schema", self.json_schema, "a string")
        check(isinstance(self.think, bool), "think", self.think, "true or false")
        check(self.reasoning_effort is None or self.reasoning_effort in REASONING_EFFORTS,
              "reasoning_effort", self.reasoning_effort,
              f"null or one of {', '.join(REASONING_EFFORTS)}")
        check(isinstance(self.compare_models, list) and all(
            isinstance(m, str) and m.strip() for m in self.compare_models)
            and len(set(self.compare_models)) == len(self.compare_models),
            "compare_models", self.compare_models, "a list of distinct model sources")
        check(isinstance(self.beam_search, bool), "beam_search", self.beam_search,
              "true or false")
        check(_is_int(self.beam_width) and MIN_BEAM_WIDTH <= self.beam_width <= MAX_BEAM_WIDTH,
              "beam_width", self.beam_width,
              f"an integer in [{MIN_BEAM_WIDTH}, {MAX_BEAM_WIDTH}]")
        check(_is_number(self.length_penalty) and abs(self.length_penalty) <= MAX_LENGTH_PENALTY,
              "length_penalty", self.length_penalty,
              f"a number in [-{MAX_LENGTH_PENALTY}, {MAX_LENGTH_PENALTY}]")
        if self.json_mode:
            json_mode.parse_schema(self.json_schema)

    def to_sampling_params(self, n: int | None = None) -> SamplingParams:
        """Engine sampling params for one turn; n defaults to num_candidates."""
        # Imported here so the store and settings load without pulling in the engine (torch).
        from engine.sampling_params import SamplingParams

        return SamplingParams(
            n=self.num_candidates if n is None else n,
            temperature=float(self.temperature),
            top_p=float(self.top_p),
            top_k=self.top_k,
            min_p=float(self.min_p),
            repetition_penalty=float(self.repetition_penalty),
            seed=self.seed,
            max_tokens=self.max_tokens,
            response_format=json_mode.response_format(self.json_mode, self.json_schema),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, strict: bool = True,
                  dropped: list[str] | None = None) -> ChatSettings:
        """Build from a dict. strict: unknown keys and bad values raise ValueError;
        otherwise unknown keys are ignored, each bad value falls back to its default and
        its name is appended to dropped."""
        if not isinstance(data, dict):
            raise ValueError(f"ChatSettings must be a JSON object, got {data!r}")
        if strict:
            unknown = sorted(set(data) - {f.name for f in fields(cls)})
            if unknown:
                raise ValueError(f"ChatSettings has no field(s) {', '.join(unknown)}")
            return cls(**data)
        return cls(**_valid_subset(cls, data, dropped))


@dataclass(slots=True)
class AppSettings:
    chat_defaults: ChatSettings = field(default_factory=ChatSettings)
    last_model: str | None = None
    model_paths: list[str] = field(default_factory=list)
    # Qt's saveGeometry()/saveState() as base64 text: opaque to everything but the GUI.
    window_geometry: str = ""
    dock_state: str = ""
    # Remote OpenAI-compatible servers added as model sources.
    servers: list[ServerEntry] = field(default_factory=list)
    # "Serve the loaded model on localhost:PORT" (the app's own OpenAI-compatible API).
    serve_enabled: bool = False
    serve_port: int = 8000
    # The look: "system" (follow the desktop; FOLIO_THEME overrides it), "light" or "dark".
    theme: str = "system"
    # Device, weights and memory for chats (data.engine_settings); changing them reloads.
    engine: EngineSettings = field(default_factory=EngineSettings)
    # MCP tools that run without asking ("server/tool"), chosen on a tool call's card.
    always_allowed_tools: list[str] = field(default_factory=list)
    # Each model's chat template choice by its source (data.model_templates).
    model_templates: dict[str, ModelTemplate] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.chat_defaults, dict):
            self.chat_defaults = ChatSettings.from_dict(self.chat_defaults)
        if isinstance(self.engine, dict):
            self.engine = EngineSettings.from_dict(self.engine)
        if isinstance(self.servers, list):
            self.servers = [ServerEntry.from_dict(s) for s in self.servers]
        if isinstance(self.model_templates, dict):
            self.model_templates = {
                source: t if isinstance(t, ModelTemplate) else ModelTemplate.from_dict(t)
                for source, t in self.model_templates.items()}
        check = _checker("AppSettings")
        check(isinstance(self.chat_defaults, ChatSettings), "chat_defaults",
              self.chat_defaults, "a ChatSettings")
        check(self.last_model is None or isinstance(self.last_model, str), "last_model",
              self.last_model, "a string or None")
        check(isinstance(self.model_paths, list)
              and all(isinstance(p, str) and p for p in self.model_paths),
              "model_paths", self.model_paths, "a list of non-empty strings")
        check(isinstance(self.window_geometry, str), "window_geometry", self.window_geometry,
              "a string")
        check(isinstance(self.dock_state, str), "dock_state", self.dock_state, "a string")
        check(isinstance(self.servers, list), "servers", self.servers, "a list of servers")
        check(isinstance(self.serve_enabled, bool), "serve_enabled", self.serve_enabled,
              "true or false")
        check(_is_int(self.serve_port) and 1 <= self.serve_port <= 65535, "serve_port",
              self.serve_port, "a port number in [1, 65535]")
        check(self.theme in THEMES, "theme", self.theme, f"one of {', '.join(THEMES)}")
        check(isinstance(self.engine, EngineSettings), "engine", self.engine,
              "an EngineSettings")
        check(isinstance(self.always_allowed_tools, list)
              and all(isinstance(k, str) and "/" in k for k in self.always_allowed_tools),
              "always_allowed_tools", self.always_allowed_tools,
              "a list of \"server/tool\" names")
        check(isinstance(self.model_templates, dict)
              and all(isinstance(k, str) and k for k in self.model_templates),
              "model_templates", self.model_templates, "an object of templates by model")

    def remember_model_path(self, path: str) -> None:
        """Add a model path (most recent first, no duplicates)."""
        if not isinstance(path, str) or not path:
            raise ValueError(f"AppSettings.model_paths entries must be non-empty strings, "
                             f"got {path!r}")
        self.model_paths = [path] + [p for p in self.model_paths if p != path]

    def add_server(self, entry: ServerEntry) -> None:
        """Add a server (most recent first; the same URL and model replaces the old one)."""
        self.servers = [entry] + [s for s in self.servers if s.source != entry.source]

    def server_for(self, source: str) -> ServerEntry | None:
        return next((s for s in self.servers if s.source == source), None)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["version"] = SETTINGS_VERSION
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], dropped: list[str] | None = None) -> AppSettings:
        """Lenient: unknown keys are ignored, each bad value falls back to its default and
        its name is appended to dropped."""
        if not isinstance(data, dict):
            raise ValueError(f"settings must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("version", None)
        chat = data.get("chat_defaults")
        if isinstance(chat, dict) and version != SETTINGS_VERSION:
            chat = without_old_default(chat)
        if isinstance(chat, dict):
            inner: list[str] = []
            data["chat_defaults"] = ChatSettings.from_dict(chat, strict=False, dropped=inner)
            if dropped is not None:
                dropped.extend(f"chat_defaults.{name}" for name in inner)
        engine = data.get("engine")
        if isinstance(engine, dict):
            inner = []
            data["engine"] = EngineSettings(**_valid_subset(EngineSettings, engine, inner))
            if dropped is not None:
                dropped.extend(f"engine.{name}" for name in inner)
        return cls(**_valid_subset(cls, data, dropped))


def without_old_default(settings: dict[str, Any]) -> dict[str, Any]:
    """Chat settings saved before version 2 with the old default max tokens read as the
    new default (see the module doc)."""
    if settings.get("max_tokens") == OLD_DEFAULT_MAX_TOKENS:
        return {**settings, "max_tokens": None}
    return settings


def _valid_subset(cls: type, data: dict[str, Any], dropped: list[str] | None) -> dict[str, Any]:
    """The known keys of data whose values cls accepts, each checked on top of the others."""
    known = {f.name for f in fields(cls)}
    good: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            continue
        try:
            cls(**{**good, key: value})
        except ValueError as err:
            logger.warning("ignoring setting %s: %s", key, err)
            if dropped is not None:
                dropped.append(key)
            continue
        good[key] = value
    return good


def config_dir() -> Path:
    override = os.environ.get("FOLIO_CONFIG_DIR")
    return Path(override) if override else Path(platformdirs.user_config_dir("folio"))


def settings_path() -> Path:
    return config_dir() / SETTINGS_FILE


def load_settings(path: Path | str | None = None) -> AppSettings:
    """Read settings; a missing file gives defaults, a damaged one is backed up (see module doc)."""
    path = Path(path) if path is not None else settings_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return AppSettings()
    dropped: list[str] = []
    try:
        settings = AppSettings.from_dict(json.loads(text), dropped)
    except ValueError as err:  # json.JSONDecodeError is a ValueError
        logger.warning("settings file %s is damaged (%s): using defaults", path, err)
        _backup(path)
        return AppSettings()
    if dropped:
        # The next save would silently lose what the user wrote: keep the original.
        _backup(path)
    return settings


def save_settings(settings: AppSettings, path: Path | str | None = None) -> Path:
    """Write atomically: a crash mid-write leaves the previous file intact."""
    path = Path(path) if path is not None else settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(settings.to_dict(), indent=2, sort_keys=True) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=".settings-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _backup(path: Path) -> None:
    backup = path.with_name(path.name + ".bak")
    try:
        os.replace(path, backup)
    except OSError as err:
        logger.warning("could not back up %s: %s", path, err)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _checker(owner: str) -> Callable[[bool, str, object, str], None]:
    def check(ok: bool, name: str, value: object, expected: str) -> None:
        if not ok:
            raise ValueError(f"{owner}.{name} must be {expected}, got {value!r}")
    return check
