"""The `folio` command's handling of models it cannot load."""

from __future__ import annotations

import pytest

from engine.cli import main


@pytest.mark.parametrize("argv", [["chat", "--model"], ["bench", "decode", "--model"]])
def test_a_missing_model_ends_with_the_loaders_message_not_a_traceback(tmp_path, capsys, argv):
    missing = tmp_path / "no-such-model"
    assert main([*argv, str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("folio: error: model ") and str(missing) in err
    assert "not found" in err and "Traceback" not in err


def test_a_corrupt_gguf_file_is_named_in_the_error(tmp_path, capsys):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all")
    assert main(["bench", "decode", "--model", str(broken)]) == 2
    assert str(broken) in capsys.readouterr().err
