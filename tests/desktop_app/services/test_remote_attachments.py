"""A server's model is sent a message's attachments as OpenAI's parts: an image as an
``image_url`` data URL, a document as a ``file`` part (a data URL and its name)."""

from __future__ import annotations

import base64

from desktop_app.data.attachments import read_attachment
from desktop_app.data.chat_store import ChatStore
from engine.sampling_params import SamplingParams
from tests.desktop_app.data.test_chat_attachments import png
from tests.desktop_app.services.test_remote import run, stubs, worker_on  # noqa: F401


def test_attachments_reach_a_server_as_openai_parts(stubs):  # noqa: F811
    store = ChatStore(":memory:")
    chat = store.create_chat("remote")
    image = read_attachment("cat.png", png())
    doc = read_attachment("notes.md", b"# Notes\n\nThe code is 4417.\n")
    user = store.add_message(chat.id, None, "user", "what?", attachments=[image, doc])
    stub = stubs()
    worker = worker_on(stub.url)
    run(worker, SamplingParams(max_tokens=3), store.messages_for_engine(user.id))
    [body] = stub.bodies
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + base64.b64encode(image.data).decode()}},
        {"type": "file", "file": {
            "file_data": "data:text/markdown;base64," + base64.b64encode(doc.data).decode(),
            "filename": "notes.md"}},
        {"type": "text", "text": "what?"}]}]
    worker.shutdown()
    store.close()
