"""ModelLibrary: names from the catalog and --models-dir folders, aliases, problems."""

from __future__ import annotations

import pytest

from engine.hosting.library import ModelLibrary, UnknownModel, models_in
from engine.loaders.catalog import STARTER
from tests.engine.tiny_models import save_tiny_model


def test_a_models_dir_adds_its_gguf_files_and_model_folders(tmp_path):
    save_tiny_model(tmp_path / "tiny")
    (tmp_path / "notes").mkdir()
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf")
    assert [p.name for p in models_in(tmp_path)] == ["broken.gguf", "tiny"]
    library = ModelLibrary(models_dirs=[tmp_path])
    assert library.names()[0] == STARTER and "tiny" in library.names()
    assert [p.path.name for p in library.problems] == ["broken.gguf"]
    assert library.source(STARTER) == STARTER
    assert library.source("tiny") == str(tmp_path / "tiny")
    # The starter answers to the name a one-model server gave it, its file's stem.
    stem = library.info(STARTER).path.stem
    assert library.resolve(stem) == STARTER
    with pytest.raises(UnknownModel, match="'broken' is not in this server's library"):
        library.resolve("broken")


def test_a_model_added_later_is_found_on_its_first_request(tmp_path):
    library = ModelLibrary(models_dirs=[tmp_path])
    assert "late" not in library.names()
    save_tiny_model(tmp_path / "late")
    assert library.resolve("late") == "late"


def test_a_models_dir_must_be_a_folder(tmp_path):
    with pytest.raises(ValueError, match="^models_dirs: .* is not a folder"):
        ModelLibrary(models_dirs=[tmp_path / "missing"])
