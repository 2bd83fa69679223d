import json

import pytest

from desktop_app.data import settings as settings_mod
from desktop_app.data.settings import (
    AppSettings,
    ChatSettings,
    load_settings,
    save_settings,
    settings_path,
)


def test_chat_defaults():
    s = ChatSettings()
    assert (s.system_prompt, s.temperature, s.top_p, s.top_k, s.min_p, s.repetition_penalty,
            s.max_tokens, s.seed, s.num_candidates) == ("", 0.7, 0.95, 40, 0.05, 1.1, None, None, 1)
    assert s.to_sampling_params().max_tokens is None  # up to the context


def test_the_old_default_max_tokens_of_an_older_file_reads_as_up_to_the_context(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"version": 1, "chat_defaults": {"max_tokens": 512}}))
    assert load_settings(path).chat_defaults.max_tokens is None
    path.write_text(json.dumps({"version": 1, "chat_defaults": {"max_tokens": 2000}}))
    assert load_settings(path).chat_defaults.max_tokens == 2000
    # Saved since, 512 is the user's choice and stays.
    save_settings(AppSettings(chat_defaults=ChatSettings(max_tokens=512)), path)
    assert json.loads(path.read_text())["version"] == settings_mod.SETTINGS_VERSION
    assert load_settings(path).chat_defaults.max_tokens == 512


@pytest.mark.parametrize("field, value", [
    ("temperature", -0.1), ("temperature", "hot"), ("top_p", 0), ("top_p", 1.5),
    ("top_k", -1), ("top_k", 2.5), ("top_k", True), ("min_p", 1.01),
    ("repetition_penalty", 0), ("max_tokens", 0), ("max_tokens", 12.0), ("seed", -1),
    ("seed", "7"), ("num_candidates", 0), ("num_candidates", 5), ("system_prompt", None),
    ("temperature", float("nan")),
])
def test_chat_settings_reject_bad_values(field, value):
    with pytest.raises(ValueError, match=f"ChatSettings.{field} must be"):
        ChatSettings(**{field: value})


def test_to_sampling_params():
    s = ChatSettings(temperature=0, top_p=1, top_k=0, min_p=0.1, repetition_penalty=1.3,
                     max_tokens=64, seed=3, num_candidates=3)
    p = s.to_sampling_params()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty, p.seed,
            p.max_tokens) == (3, 0.0, 1.0, 0, 0.1, 1.3, 3, 64)
    assert type(p.temperature) is float and type(p.top_p) is float
    assert s.to_sampling_params(n=1).n == 1


def test_chat_settings_from_dict():
    assert ChatSettings.from_dict({"temperature": 0.2}) == ChatSettings(temperature=0.2)
    with pytest.raises(ValueError, match="no field"):
        ChatSettings.from_dict({"temperature": 0.2, "bogus": 1})
    dropped = []
    lenient = ChatSettings.from_dict({"temperature": -3, "top_k": 7, "bogus": 1},
                                     strict=False, dropped=dropped)
    assert lenient == ChatSettings(top_k=7)
    assert dropped == ["temperature"]


def test_path_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("FOLIO_CONFIG_DIR", str(tmp_path / "cfg"))
    assert settings_path() == tmp_path / "cfg" / "settings.json"


def test_missing_file_gives_defaults(tmp_path):
    assert load_settings(tmp_path / "none.json") == AppSettings()


def test_save_and_load_roundtrip(monkeypatch, tmp_path):
    monkeypatch.setenv("FOLIO_CONFIG_DIR", str(tmp_path / "cfg"))
    s = AppSettings(chat_defaults=ChatSettings(system_prompt="Hi", seed=9, num_candidates=4),
                    last_model="starter", window_geometry="AdnQywAD", dock_state="AAAA/w==")
    s.remember_model_path("/models/a.gguf")
    s.remember_model_path("/models/b")
    s.remember_model_path("/models/a.gguf")
    assert s.model_paths == ["/models/a.gguf", "/models/b"]
    path = save_settings(s)
    assert path == tmp_path / "cfg" / "settings.json"
    assert load_settings() == s
    assert json.loads(path.read_text())["version"] == settings_mod.SETTINGS_VERSION
    assert sorted(p.name for p in path.parent.iterdir()) == ["settings.json"]  # no temp left


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "settings.json"
    save_settings(AppSettings(last_model="old"), path)

    def crash(src, dst):
        raise OSError("power cut")

    monkeypatch.setattr(settings_mod.os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        save_settings(AppSettings(last_model="new"), path)
    monkeypatch.undo()
    assert load_settings(path).last_model == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["settings.json"]


def test_corrupt_file_falls_back_and_keeps_backup(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text('{"last_model": "x", oops')
    assert load_settings(path) == AppSettings()
    assert (tmp_path / "settings.json.bak").read_text() == '{"last_model": "x", oops'
    assert not path.exists()
    path.write_text("[1, 2]")
    assert load_settings(path) == AppSettings()
    assert (tmp_path / "settings.json.bak").read_text() == "[1, 2]"


def test_bad_values_fall_back_per_field(tmp_path):
    path = tmp_path / "settings.json"
    original = json.dumps({"last_model": "starter", "model_paths": "not a list",
                           "chat_defaults": {"temperature": 9, "top_k": 5},
                           "from_the_future": True})
    path.write_text(original)
    s = load_settings(path)
    assert s == AppSettings(chat_defaults=ChatSettings(top_k=5), last_model="starter")
    assert (tmp_path / "settings.json.bak").read_text() == original


def test_unknown_keys_alone_need_no_backup(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"last_model": "m", "from_the_future": 1}))
    assert load_settings(path) == AppSettings(last_model="m")
    assert not (tmp_path / "settings.json.bak").exists()


@pytest.mark.parametrize("field, value", [
    ("last_model", 3), ("model_paths", [""]), ("window_geometry", None), ("dock_state", b"x"),
])
def test_app_settings_reject_bad_values(field, value):
    with pytest.raises(ValueError, match=f"AppSettings.{field} must be"):
        AppSettings(**{field: value})
