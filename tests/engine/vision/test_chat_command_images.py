"""``folio chat --image PATH`` and ``/image PATH``: the image goes with the next message,
a refused image is said and the chat goes on without it."""

from __future__ import annotations

import io

import pytest

from engine import LLM, SamplingParams
from engine.chat import ChatRequest
from engine.cli import TerminalChat, main
from tests.engine.vision.tiny_idefics3 import png, save_tiny_idefics3

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_idefics3(tmp_path_factory.mktemp("idefics3") / "smolvlm")


def test_an_attached_image_goes_with_the_next_message(folder, tmp_path):
    picture = tmp_path / "red.png"
    picture.write_bytes(png(31, (48, 40)))
    with LLM(str(folder), num_gpu_blocks=128, block_size=8) as llm:
        chat = TerminalChat(llm, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
                            io.StringIO())
        chat.attach(str(picture))
        chat.handle("what is it?")
        first = chat.messages[0]["content"]
        assert first[0]["type"] == "image" and first[1]["text"] == "what is it?"
        with_image = llm.engine.prompts.count(ChatRequest(chat.messages[:1]))
        assert f"[{with_image} prompt tokens" in chat.out.getvalue()
        chat.handle("and now?")  # no image this time
        assert chat.messages[2]["content"] == "and now?"
        # A file that is no image: refused by name, and the chat goes on.
        bad = tmp_path / "notes.png"
        bad.write_text("not a picture")
        chat.handle(f"/image {bad}")
        with pytest.raises(ValueError, match="not an image"):
            chat.handle("this one?")
        assert len(chat.messages) == 4 and chat.images == []
        chat.handle("still there?")
        assert len(chat.messages) == 6


def test_a_missing_image_file_is_an_error_not_a_traceback(folder, capsys):
    assert main(["chat", "--model", str(folder), "--image", "/no/such.png"]) == 2
    assert "--image /no/such.png: cannot be read" in capsys.readouterr().err
