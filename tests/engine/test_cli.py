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


def test_folio_chat_passes_its_reasoning_effort_to_the_template(tmp_path):
    """`folio chat --reasoning-effort`: each turn's prompt is the template's at that level
    (gpt-oss's harmony format here), not its default."""
    import io

    from engine import LLM, SamplingParams
    from engine.cli import TerminalChat
    from tests.engine.text.reasoning.thinking_models import save_harmony_format_model

    path = save_harmony_format_model(tmp_path / "gpt-oss")
    llm = LLM(str(path), num_gpu_blocks=64, max_model_len=512)
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    asked = [{"role": "user", "content": "hi"}]
    sizes = {}
    for effort in ("low", "high"):
        chat = TerminalChat(llm, params, io.StringIO(), reasoning_effort=effort)
        chat.handle("hi")
        sizes[effort] = len(llm.tokenizer.encode_chat(asked, reasoning_effort=effort))
        assert f"[{sizes[effort]} prompt tokens" in chat.out.getvalue()
    assert sizes["low"] != sizes["high"]


def test_folio_chat_refuses_an_effort_it_has_no_level_for(capsys):
    with pytest.raises(SystemExit):
        main(["chat", "--reasoning-effort", "max"])
    assert "--reasoning-effort" in capsys.readouterr().err
