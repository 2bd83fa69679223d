"""Server entries: URLs, sources, and the API key kept only when the user asks."""

from __future__ import annotations

import json

import pytest

from desktop_app.data.servers import (
    ServerEntry,
    host_of,
    is_remote_source,
    normalize_base_url,
    parse_server_source,
    server_source,
)
from desktop_app.data.settings import AppSettings, load_settings, save_settings


@pytest.mark.parametrize("given, expected", [
    ("http://gpu-box:8000/v1", "http://gpu-box:8000/v1"),
    ("http://gpu-box:8000/v1/", "http://gpu-box:8000/v1"),
    ("gpu-box:8000", "http://gpu-box:8000/v1"),
    (" https://api.example.com ", "https://api.example.com/v1"),
    ("http://10.0.0.2:30000/api/v1", "http://10.0.0.2:30000/api/v1"),
])
def test_normalize_base_url(given, expected):
    assert normalize_base_url(given) == expected


@pytest.mark.parametrize("bad", ["", "ftp://x/v1", "http://", "http://h:99999/v1"])
def test_bad_urls_say_what_is_wrong(bad):
    with pytest.raises(ValueError, match="URL|port"):
        normalize_base_url(bad)


def test_sources_round_trip_and_carry_no_key():
    entry = ServerEntry("gpu-box:8000", "org/Model-7B:q4", api_key="sk-1")
    assert entry.source == "remote:http://gpu-box:8000/v1#org/Model-7B:q4"
    assert entry.source == server_source(entry.base_url, entry.model)
    assert parse_server_source(entry.source) == ("http://gpu-box:8000/v1", "org/Model-7B:q4")
    assert is_remote_source(entry.source) and not is_remote_source("/models/x.gguf")
    assert host_of(entry.base_url) == entry.host == "gpu-box:8000"
    assert "sk-1" not in repr(entry) and "sk-1" not in entry.source
    with pytest.raises(ValueError):
        parse_server_source("starter")


def test_settings_keep_servers_and_the_serve_switch(tmp_path):
    settings = AppSettings()
    assert (settings.servers, settings.serve_enabled, settings.serve_port) == ([], False, 8000)
    forgotten = ServerEntry("http://a:8000/v1", "m1")
    remembered = ServerEntry("http://b:8000/v1", "m2", api_key="sk-keep", max_model_len=4096)
    settings.add_server(forgotten)
    settings.add_server(remembered)
    settings.add_server(ServerEntry("http://a:8000/v1", "m1"))  # the same again: moves up
    settings.serve_enabled, settings.serve_port = True, 8123
    path = save_settings(settings, tmp_path / "settings.json")
    data = json.loads(path.read_text())
    assert [s["model"] for s in data["servers"]] == ["m1", "m2"]
    assert [s["api_key"] for s in data["servers"]] == ["", "sk-keep"]
    loaded = load_settings(path)
    assert loaded == settings
    assert loaded.server_for(remembered.source) == remembered
    assert loaded.server_for("remote:http://c/v1#x") is None


def test_bad_server_and_port_values_fall_back(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"servers": [{"base_url": "ftp://x", "model": "m"}],
                                "serve_port": 70000, "serve_enabled": "yes",
                                "last_model": "starter"}))
    settings = load_settings(path)
    assert (settings.servers, settings.serve_port, settings.serve_enabled) == ([], 8000, False)
    assert settings.last_model == "starter"
    assert (tmp_path / "settings.json.bak").exists()
