"""Attachments in the chat store: read and checked once (each bad file a message naming
it), stored by sha256 once however many messages hold them, kept while any chat uses
them, sent as the engine's parts, carried by the JSON export (embedded) and the Markdown
export (files beside it), and every existing chat kept by the v5 migration."""

from __future__ import annotations

import base64
import io
import json
import random
import sqlite3

import pytest
from PIL import Image

from desktop_app.data import attachments as att
from desktop_app.data import chat_schema as schema
from desktop_app.data import chat_store
from desktop_app.data.chat_import import ChatImportError
from desktop_app.data.chat_store import ChatStore
from engine.bench.pdf_writer import write_pdf
from engine.documents.limits import MAX_FILE_BYTES


def png(color=(200, 30, 30), size=(12, 8)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def noisy_png() -> bytes:
    """A picture whose compressed data is long enough to cut in half."""
    buf = io.BytesIO()
    Image.frombytes("RGB", (64, 64), random.Random(7).randbytes(64 * 64 * 3)).save(buf, "PNG")
    return buf.getvalue()


def test_an_image_and_a_pdf_are_read_with_what_their_chips_say():
    image = att.read_attachment("cat.png", png())
    assert (image.kind, image.media_type, image.detail) == ("image", "image/png", "12 × 8")
    pdf = att.read_attachment("report.pdf", write_pdf([["one"], ["two"], ["three"]]))
    assert (pdf.kind, pdf.media_type, pdf.detail) == ("file", "application/pdf", "3 pages")
    assert pdf.sha256 == att.sha256_of(pdf.data) and pdf.size == len(pdf.data)
    code = att.read_attachment("main.py", b"print('hi')\n")
    assert code.kind == "file" and code.media_type.startswith("text/")


@pytest.mark.parametrize(("name", "data", "words"), [
    ("broken.png", noisy_png()[:6000], "broken.png: the image data is corrupt"),
    ("fake.jpg", b"not an image at all", "fake.jpg: not an image"),
    ("locked.pdf", write_pdf([["secret"]], user_password="pw"), "locked.pdf: the PDF is "
     "encrypted"),
    ("tool.exe", b"MZ\x90\x00binary", "tool.exe: unknown type (.exe)"),
    ("scan.pdf", write_pdf([[]]), "scan.pdf: the PDF has no text"),
])
def test_a_bad_file_is_refused_naming_it_and_why(name, data, words):
    with pytest.raises(att.AttachmentError) as caught:
        att.read_attachment(name, data)
    assert words in str(caught.value)


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "huge.txt"
    with big.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(att.AttachmentError, match=r"huge\.txt: 32\.0 MiB is over the limit"):
        att.read_file(big)


@pytest.fixture
def mem_store():
    s = ChatStore(":memory:")
    yield s
    s.close()


def _stored(s) -> list[str]:
    return [r[0] for r in s._conn.execute("SELECT sha256 FROM attachments")]


def test_the_same_file_in_two_chats_is_stored_once_and_outlives_one_of_them(mem_store):
    s = mem_store
    image = att.read_attachment("cat.png", png())
    first, second = s.create_chat("a"), s.create_chat("b")
    m1 = s.add_message(first.id, None, "user", "look", attachments=[image])
    m2 = s.add_message(second.id, None, "user", "again", attachments=[image])
    assert _stored(s) == [image.sha256]
    assert s.get_message(m1.id).attachments == [image.without_data()]
    s.delete_chat(first.id)
    assert _stored(s) == [image.sha256]  # the other chat still holds it
    assert s.attachment_data(image.sha256) == image.data
    s.delete_message(m2.id)
    assert _stored(s) == []
    orphan = s.add_message(second.id, None, "user", "x").id
    with pytest.raises(sqlite3.IntegrityError), s._tx() as c:  # no pointing at nothing
        c.execute("INSERT INTO message_attachments VALUES (?, 0, 'image', 'x', 'image/png',"
                  " 'feed', '')", (orphan,))


def test_an_attachment_without_bytes_must_name_a_stored_file(mem_store):
    chat = mem_store.create_chat("a")
    image = att.read_attachment("cat.png", png())
    with pytest.raises(ValueError, match=r"attachments\[0\]: no stored file"):
        mem_store.add_message(chat.id, None, "user", "x", attachments=[image.without_data()])
    assert mem_store.roots(chat.id) == []  # the message went with its transaction


def test_messages_for_engine_carry_the_engine_parts(mem_store):
    s = mem_store
    chat = s.create_chat("a")
    image = att.read_attachment("cat.png", png())
    doc = att.read_attachment("notes.md", b"# Notes\n\nThe code is 4417.\n")
    user = s.add_message(chat.id, None, "user", "what is it?", attachments=[image, doc])
    [message] = s.messages_for_engine(user.id)
    assert message["content"] == [
        {"type": "image", "image": image.data},
        {"type": "file", "file": {"file_data": "data:text/markdown;base64,"
                                  + base64.b64encode(doc.data).decode(), "filename": "notes.md"}},
        {"type": "text", "text": "what is it?"}]
    remote = att.openai_content(message["content"])
    assert remote[0] == {"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(image.data).decode()}}
    assert remote[1:] == message["content"][1:]


def test_json_export_embeds_each_file_once_and_imports_back(mem_store):
    s = mem_store
    chat = s.create_chat("pictures")
    image = att.read_attachment("cat.png", png())
    first = s.add_message(chat.id, None, "user", "one", attachments=[image])
    reply = s.add_message(chat.id, first.id, "assistant", "a cat")
    s.add_message(chat.id, reply.id, "user", "two", attachments=[image])
    text = s.export_json(chat.id)
    data = json.loads(text)
    assert data["version"] == 4 and list(data["attachments"]) == [image.sha256]
    assert data["messages"][0]["attachments"][0]["name"] == "cat.png"
    copy = s.import_json(text)
    branch = s.path_to(s.active_leaf(copy.id))
    assert [m.attachments for m in branch] == [[image.without_data()], [],
                                               [image.without_data()]]
    s.delete_chat(chat.id)
    assert s.attachment_data(image.sha256) == image.data  # the copy holds it


@pytest.mark.parametrize(("change", "words"), [
    (lambda d: d["attachments"].clear(), "is not one of the files embedded"),
    (lambda d: d["attachments"].update({k: "!!" for k in d["attachments"]}),
     "not valid base64"),
    (lambda d: d["attachments"].update({k: base64.b64encode(b"other").decode()
                                        for k in d["attachments"]}), "do not match its sha256"),
    (lambda d: d["messages"][0]["attachments"][0].update(kind="video"), "kind"),
    (lambda d: d["messages"][0]["attachments"][0].update(size=1), "is not the embedded"),
    (lambda d: d["messages"][0]["attachments"][0].pop("detail"), "missing field(s): detail"),
])
def test_a_bad_attachment_in_an_import_is_named_and_nothing_is_written(mem_store, change,
                                                                       words):
    s = mem_store
    chat = s.create_chat("pictures")
    s.add_message(chat.id, None, "user", "one",
                  attachments=[att.read_attachment("cat.png", png())])
    data = json.loads(s.export_json(chat.id))
    change(data)
    with pytest.raises(ChatImportError, match="attachments") as caught:
        s.import_json(json.dumps(data))
    assert words in str(caught.value)
    assert len(s.list_chats()) == 1


def test_markdown_export_links_the_files_written_beside_it(mem_store):
    s = mem_store
    chat = s.create_chat("mixed")
    a = att.read_attachment("photo.png", png())
    b = att.read_attachment("photo.png", png((0, 0, 255)))  # same name, another file
    doc = att.read_attachment("report.pdf", write_pdf([["x"], ["y"]]))
    s.add_message(chat.id, None, "user", "see", attachments=[a, b, doc])
    markdown = s.export_markdown(chat.id, folder="mixed files")
    assert "![photo.png](mixed%20files/photo.png)" in markdown
    assert "![photo.png](mixed%20files/photo-2.png)" in markdown
    assert "[report.pdf](mixed%20files/report.pdf) (" in markdown and "2 pages" in markdown
    files = s.markdown_attachments(chat.id)
    assert files == {"photo.png": a.data, "photo-2.png": b.data, "report.pdf": doc.data}


def test_the_v5_migration_keeps_every_chat(tmp_path):
    path = tmp_path / "chats.sqlite3"
    conn = schema.open_database(path, chat_store.MIGRATIONS[:4])
    conn.execute("INSERT INTO chats (id, title, created_at, updated_at, settings)"
                 " VALUES (1, 'before attachments', 1, 1, '{}')")
    for mid, parent, role, text in ((1, None, "user", "hello"), (2, 1, "assistant", "hi")):
        conn.execute("INSERT INTO messages (id, chat_id, parent_id, role, content, status,"
                     " created_at, touched_at) VALUES (?, 1, ?, ?, ?, 'complete', 1, 1)",
                     (mid, parent, role, text))
    conn.close()
    with ChatStore(path) as s:
        assert s.schema_version == 5
        branch = s.path_to(2)
        assert [(m.content, m.attachments) for m in branch] == [("hello", []), ("hi", [])]
        image = att.read_attachment("cat.png", png())
        s.add_message(1, 2, "user", "now", attachments=[image])
        assert s.get_message(3).attachments == [image.without_data()]
