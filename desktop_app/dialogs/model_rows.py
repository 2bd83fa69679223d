"""What the model manager's table shows: a row per local model (engine.loaders.catalog's
ModelInfo) or added server (``ServerRow``), and the words around downloads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from desktop_app.data.model_templates import turn_format_of
from desktop_app.data.servers import ServerEntry


@dataclass(slots=True)
class ServerRow:
    """A server in the model manager's table (beside the local models' ModelInfo)."""

    entry: ServerEntry
    error: str = ""

    @property
    def source(self) -> str:
        return self.entry.source

    @property
    def name(self) -> str:
        return self.entry.model

    @property
    def path(self) -> str:  # the table's tooltip
        return self.entry.base_url

    def cells(self, loaded: bool) -> tuple[str, ...]:
        context = str(self.entry.max_model_len or "")
        return (self.entry.model, "remote", self.entry.host, "", context, "",
                "on the server", "● loaded" if loaded else "", "the server's")


COLUMNS = ("Name", "Format", "Architecture", "Parameters", "Context", "On disk",
           "Memory needed", "Status", "Chat template")


def template_cell(info, choice) -> str:
    """The "Chat template" column: the file's, its family's format where the file has
    none, or the choice made in the model's template settings (data.model_templates)."""
    from desktop_app.data.model_templates import CHATML, FAMILY, FILE
    from engine.text.turn_formats import FORMATS

    label = FORMATS[turn_format_of(info.architecture)].label
    kind = FILE if choice is None else choice.kind
    if kind == FILE:
        return "the file's" if info.has_chat_template else f"{label} (the file has none)"
    if kind == FAMILY:
        return f"{label} (chosen)"
    return "ChatML (chosen)" if kind == CHATML else "pasted (chosen)"


def format_parameters(n: int, active: int | None = None) -> str:
    """A parameter count ("7.2 B"); a mixture of experts shows every expert's and what one
    token reads ("MoE: 6.9 B, 1.3 B active")."""
    if active is not None:
        return f"MoE: {format_parameters(n)}, {format_parameters(active)} active"
    if n >= 10**9:
        return f"{n / 10**9:.1f} B"
    if n >= 10**6:
        return f"{n / 10**6:.1f} M"
    return str(n)


def row_name(info) -> str:
    """The Name column: the starter by its real name (services.sources.display_name)."""
    from desktop_app.services.sources import STARTER, display_name

    return display_name(STARTER) if info.name == STARTER else info.name


def installed_source(entry, infos) -> str | None:
    """The source of a catalog entry (data.model_catalog) among the listed local models:
    its repo's folder in the Hugging Face cache, and its .gguf file when it names one."""
    from huggingface_hub.file_download import repo_folder_name

    folder = repo_folder_name(repo_id=entry.repo, repo_type="model")
    for info in infos:
        if isinstance(info, ServerRow) or info.error:
            continue
        parts = Path(info.path).parts
        if folder in parts and (entry.file is None or Path(info.path).name == entry.file):
            return source_for(info)
    return None


def source_for(info) -> str:
    """What to load for a listed model (a server's row knows its own source)."""
    if isinstance(info, ServerRow):
        return info.source
    return "starter" if info.name == "starter" else str(info.path)


def memory_needed(info, engine_config) -> int:
    """Weights plus the KV pool the engine would allocate for this model under
    `engine_config`: the engine's own figures (engine.runner.kv_cache.estimate_memory)."""
    from engine.runner.kv_cache import estimate_memory

    return estimate_memory(info, engine_config).total_bytes


def download_advice(err) -> str:
    advice = {
        "offline": "Check your internet connection (or proxy), then try again.",
        "not_found": "Check the repo id on huggingface.co: it looks like owner/name.",
        "gated": "Accept the model's license on huggingface.co and log in with "
                 "`hf auth login`, then try again.",
        "no_weights": "Pick one of the repo's .gguf files in the second field.",
        "disk_full": "Free some disk space, then try again.",
    }.get(err.kind, "Try again later.")
    return (f"{err.message[:1].upper()}{err.message[1:]}.\n\n{advice} What had arrived is "
            f"kept out of the models list: downloading again resumes it.")


def list_local_models(extra_paths):
    from engine.loaders.catalog import list_local_models as list_models

    return list_models(extra_paths)
