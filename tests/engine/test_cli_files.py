"""`folio chat --file`: the file is read before the chat starts (a bad one ends the
command with its reason), attached to each chat's first question, and a new chat with it
finds the document cached."""

from __future__ import annotations

import io
import re

from engine import LLM, SamplingParams
from engine.bench.pdf_writer import write_pdf
from engine.cli import TerminalChat, attach_files, main
from tests.engine.tiny_models import save_tiny_model


def test_a_file_is_attached_to_each_chats_first_question(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "tiny")
    pdf = tmp_path / "plant.pdf"
    pdf.write_bytes(write_pdf([["The pump code is 4471."], ["Valve nine is red."]]))
    llm = LLM(str(model), num_gpu_blocks=64, kv_disk_bytes=0)
    files = attach_files(llm, [str(pdf)])
    assert re.search(r"Attached plant\.pdf \(pdf, \d+ tokens\): read whole",
                     capsys.readouterr().out)
    chat = TerminalChat(llm, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
                        io.StringIO(), files=files)
    chat.handle("What is the pump code?")
    chat.handle("And the valve?")
    assert isinstance(chat.messages[0]["content"], list)
    assert chat.messages[2]["content"] == "And the valve?"  # attached once per chat
    chat.handle("/new")
    chat.handle("Which valve is red?")
    stats = re.findall(r"\[(\d+) prompt tokens, (\d+) cached", chat.out.getvalue())
    (first, none), _, (third, cached) = [(int(a), int(b)) for a, b in stats]
    assert none == 0 and first > 100
    # The new chat computes its question's turn (within a block), not the document.
    assert third - cached < 50 and cached > 100


def test_a_bad_file_ends_folio_chat_with_its_reason(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "tiny")
    locked = tmp_path / "locked.pdf"
    locked.write_bytes(write_pdf([["x"]], user_password="pw"))
    assert main(["chat", "--model", str(model), "--file", str(locked)]) == 2
    assert "folio chat: error: locked.pdf: the PDF is encrypted" in capsys.readouterr().err
    assert main(["chat", "--model", str(model), "--file", str(tmp_path / "none.txt")]) == 2
    assert "none.txt" in capsys.readouterr().err
