"""Hub search against a fake HfApi: only what Folio can load, and the offline words."""

from __future__ import annotations

from types import SimpleNamespace

import httpx2
import pytest

from desktop_app.services.downloads import OFFLINE_MESSAGE, DownloadError
from desktop_app.services.hub_search import HubModel, loadable, search_hub


class FakeApi:
    def __init__(self, models=None, error: Exception | None = None) -> None:
        self.models, self.error, self.calls = models or [], error, []

    def list_models(self, **kwargs):
        self.calls.append(kwargs)
        if self.error is not None:
            raise self.error
        return iter(self.models)


def _model(repo_id, tags, downloads=0):
    return SimpleNamespace(id=repo_id, tags=tags, downloads=downloads)


def test_keeps_only_loadable_repos_in_the_hubs_order():
    api = FakeApi([
        _model("Qwen/Qwen3-8B", ["transformers", "safetensors", "qwen3", "text-generation"],
               900),
        _model("someone/qwen-vision", ["safetensors", "qwen2_vl"], 800),  # not a family
        _model("bartowski/Qwen3-8B-GGUF", ["gguf", "qwen3", "base_model:Qwen/Qwen3-8B"], 700),
        _model("someone/qwen-bin", ["pytorch", "qwen2"], 600),  # no safetensors, no GGUF
        _model("google/gemma-3-4b-it", ["safetensors", "gemma3", "image-text-to-text"], 500),
    ])
    found = search_hub("qwen", api=api)
    assert found == [HubModel("Qwen/Qwen3-8B", "safetensors", "qwen3", 900),
                     HubModel("bartowski/Qwen3-8B-GGUF", "GGUF", "qwen3", 700),
                     HubModel("google/gemma-3-4b-it", "safetensors", "gemma3", 500)]
    [call] = api.calls
    assert call["search"] == "qwen" and call["sort"] == "downloads"


def test_stops_at_the_limit():
    api = FakeApi([_model(f"o/m{i}", ["gguf", "llama"]) for i in range(10)])
    assert [m.repo_id for m in search_hub("m", api=api, limit=3)] == ["o/m0", "o/m1", "o/m2"]


def test_offline_gives_the_downloads_words():
    api = FakeApi(error=httpx2.ConnectError("no route"))
    with pytest.raises(DownloadError) as info:
        search_hub("llama", api=api)
    assert (info.value.kind, info.value.message) == ("offline", OFFLINE_MESSAGE)


def test_a_blank_query_is_refused_by_name():
    with pytest.raises(ValueError, match="query"):
        search_hub("  ", api=FakeApi())


def test_loadable_needs_a_format_and_a_family():
    assert loadable("a/b", ["gguf"]) is None
    assert loadable("a/b", ["llama"]) is None
    assert loadable("a/b", ["gguf", "phi3"]) == HubModel("a/b", "GGUF", "phi3", 0)
