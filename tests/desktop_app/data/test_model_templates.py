"""Each model's chat template choice: validated by field, kept in settings.json by source,
turned into the template the engine runs."""

from __future__ import annotations

import pytest

from desktop_app.data.model_templates import (
    ModelTemplate,
    engine_template,
    template_config,
    turn_format_of,
)
from desktop_app.data.settings import AppSettings, load_settings, save_settings
from engine.config import EngineConfig
from engine.text.turn_formats import CHATML, FORMATS


@pytest.mark.parametrize(("fields", "words"), [
    ({"kind": "jinja"}, "ModelTemplate.kind"),
    ({"kind": "pasted", "text": "  "}, "ModelTemplate.text"),
    ({"kind": "file", "text": 3}, "ModelTemplate.text"),
])
def test_bad_choices_name_the_field(fields, words):
    with pytest.raises(ValueError, match=words):
        ModelTemplate(**fields)


def test_choices_are_kept_by_source_in_the_settings_file(tmp_path):
    path = tmp_path / "settings.json"
    settings = AppSettings()
    settings.model_templates["/models/gemma.gguf"] = ModelTemplate("pasted", "{{ x }}")
    settings.model_templates["starter"] = ModelTemplate("chatml")
    save_settings(settings, path)
    again = load_settings(path)
    assert again.model_templates == settings.model_templates


def test_a_bad_entry_in_the_file_falls_back_and_is_kept_aside(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text('{"model_templates": {"x": {"kind": "nonsense"}}, "theme": "dark"}')
    settings = load_settings(path)
    assert settings.model_templates == {} and settings.theme == "dark"
    assert (tmp_path / "settings.json.bak").exists()


def test_each_choice_gives_the_engine_its_template():
    assert engine_template(None, "gemma") is None  # the file's, else the family's
    assert engine_template(ModelTemplate("file"), "gemma") is None
    assert engine_template(ModelTemplate("family"), "gemma") == FORMATS["gemma"].template
    assert engine_template(ModelTemplate("chatml"), "gemma") == CHATML
    assert engine_template(ModelTemplate("pasted", "{{ a }}"), "gemma") == "{{ a }}"
    assert turn_format_of("gemma3_text") == "gemma" and turn_format_of("unknown") == "chatml"


def test_the_config_for_a_model_carries_its_choice():
    config = template_config(EngineConfig(max_model_len=512), ModelTemplate("family"),
                             "starter")
    assert config.chat_template == FORMATS["llama3"].template  # the starter is a llama file
    assert config.max_model_len == 512
    assert template_config(EngineConfig(), ModelTemplate("chatml"), "/no/such.gguf") is None
