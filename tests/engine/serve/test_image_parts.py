"""Images through ``folio serve``: OpenAI ``image_url`` parts with data: URLs, the same
image found in the prefix cache on the next request, each bad input a 400 with its
reason (and the server answering the next request), http(s) URLs refused unless the
server was started with ``allow_image_urls``."""

from __future__ import annotations

import base64
import io
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx2
import pytest
from PIL import Image

from engine import LLM
from engine.serve.app import ServeSettings
from tests.engine.serve.conftest import Served
from tests.engine.vision.test_image_decode import _png_claiming
from tests.engine.vision.tiny_idefics3 import png, save_tiny_idefics3

pytestmark = pytest.mark.usefixtures("single_torch_thread")

RED = png(21, (48, 40))


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def ask(url: str, **image_url) -> list[dict]:
    return [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": url, **image_url}}]}]


@pytest.fixture(scope="module")
def vision_llm(tmp_path_factory):
    folder = save_tiny_idefics3(tmp_path_factory.mktemp("idefics3") / "smolvlm")
    return LLM(str(folder), num_gpu_blocks=128, block_size=8)


@pytest.fixture(scope="module")
def served(vision_llm):
    server = Served(vision_llm)
    yield server
    server.stop()


def post(server: Served, messages: list[dict]) -> httpx2.Response:
    body = {"model": server.model, "messages": messages, "max_tokens": 4, "temperature": 0}
    return httpx2.post(server.url + "/v1/chat/completions", json=body, timeout=60)


def test_a_data_url_image_is_read_and_cached_by_content(served):
    first = post(served, ask(data_url(RED)))
    assert first.status_code == 200, first.text
    again = post(served, ask(data_url(RED), detail="low"))
    assert again.status_code == 200
    usage = again.json()["usage"]
    # The whole prompt but the last block's tokens found again, the image's included.
    assert usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 8
    assert again.json()["choices"][0]["message"]["content"] == \
        first.json()["choices"][0]["message"]["content"]


def _jpeg(size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("L", size, 90).save(out, format="JPEG", quality=40)
    return out.getvalue()


def test_a_huge_photo_is_scaled_down_not_refused(served):
    assert post(served, ask(data_url(_jpeg((10_000, 10_000)), "image/jpeg"))).status_code \
        == 200


@pytest.mark.parametrize(("url", "words"), [
    (data_url(b"just text, no picture"), "not an image"),
    (data_url(RED[:len(RED) // 2]), "corrupt or truncated"),
    (data_url(_png_claiming(50_000, 50_000)), "refused before decoding"),
    (data_url(RED, "text/plain"), "is not an image type"),
    ("data:image/png;base64,@@@", "base64 is invalid"),
    ("https://example.invalid/cat.png", "--allow-image-urls"),
])
def test_bad_images_are_400s_with_their_reason(served, url, words):
    response = post(served, ask(url))
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]["message"]
    # Nothing is lost: the server answers the next request.
    assert post(served, ask(data_url(RED))).status_code == 200


def test_an_unknown_image_url_field_is_refused(served):
    response = post(served, ask(data_url(RED), size="large"))
    assert response.status_code == 400 and "image_url.size" in response.text


def test_a_text_model_says_it_reads_text_only(tiny_llm):
    server = Served(tiny_llm)
    try:
        response = post(server, ask(data_url(RED)))
        assert response.status_code == 400
        assert "this model reads text only" in response.json()["error"]["message"]
    finally:
        server.stop()


class _Images(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path != "/red.png":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(RED)))
        self.end_headers()
        self.wfile.write(RED)

    def log_message(self, *args):
        pass


def test_http_urls_are_fetched_when_allowed(vision_llm):
    images = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=images.serve_forever, daemon=True).start()
    server = Served(vision_llm, ServeSettings(allow_image_urls=True))
    base = f"http://127.0.0.1:{images.server_address[1]}"
    try:
        fetched = post(server, ask(base + "/red.png"))
        assert fetched.status_code == 200, fetched.text
        inline = post(server, ask(data_url(RED)))
        assert inline.json()["choices"][0]["message"]["content"] == \
            fetched.json()["choices"][0]["message"]["content"]
        missing = post(server, ask(base + "/none.png"))
        assert missing.status_code == 400 and "HTTP 404" in missing.text
    finally:
        server.stop()
        images.shutdown()


def test_more_images_than_the_context_holds_is_a_400(tmp_path):
    short = LLM(str(save_tiny_idefics3(tmp_path / "short")), num_gpu_blocks=64,
                max_model_len=64)
    server = Served(short)
    try:
        wide = data_url(png(22, (100, 31)))  # 2 x 2 tiles and the global image
        three = [{"type": "image_url", "image_url": {"url": wide}}] * 3  # 27 tokens each
        response = post(server, [{"role": "user", "content": three}])
        assert response.status_code == 400, response.text
        assert "the model's context holds 64" in response.json()["error"]["message"]
        one = [{"role": "user", "content": three[:1]}]
        assert post(server, one).status_code == 200, post(server, one).text
    finally:
        server.stop()
