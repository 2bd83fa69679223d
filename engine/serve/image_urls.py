"""http(s) image URLs, fetched by the server only when ``folio serve --allow-image-urls``
says so: a local server that fetches whatever URL a request names lets any web page the
user opens reach the user's own network through it (server-side request forgery), so by
default the engine refuses such a URL by name (engine/vision/sources.py) and only
``data:`` URLs are read.

When allowed, each http(s) image URL of a chat is fetched once, before the prompt is
built, within a size and time limit, and handed to the engine as the image's bytes.
"""

from __future__ import annotations

from dataclasses import replace

from engine.chat.request import ChatRequest

MAX_IMAGE_BYTES = 20 << 20
FETCH_TIMEOUT_S = 10.0


class ImageFetchError(ValueError):
    """A URL that could not be fetched; the message names the field."""


def http_parts(request: ChatRequest) -> list[tuple[int, int, str]]:
    """(message, part, url) of each http(s) image URL in the chat."""
    found = []
    for i, message in enumerate(request.messages):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            url = (part.get("image_url") or {}).get("url") if isinstance(part, dict) \
                and part.get("type") == "image_url" and isinstance(part.get("image_url"),
                                                                    dict) else None
            if isinstance(url, str) and url.startswith(("http://", "https://")):
                found.append((i, j, url))
    return found


def fetch_image_urls(request: ChatRequest) -> ChatRequest:
    """``request`` with each http(s) image URL replaced by the fetched bytes (Folio's
    ``{"type": "image", "image": bytes}`` part); ImageFetchError naming the field."""
    found = http_parts(request)
    if not found:
        return request
    import httpx2

    messages = [dict(m) for m in request.messages]
    with httpx2.Client(timeout=FETCH_TIMEOUT_S, follow_redirects=True) as client:
        for i, j, url in found:
            field = f"messages[{i}].content[{j}].image_url.url"
            data = _fetch(client, url, field)
            content = list(messages[i]["content"])
            content[j] = {"type": "image", "image": data}
            messages[i]["content"] = content
    return replace(request, messages=tuple(messages))


def _fetch(client, url: str, field: str) -> bytes:
    try:
        with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise ImageFetchError(f"{field}: fetching the image gave HTTP "
                                      f"{response.status_code}")
            data = bytearray()
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > MAX_IMAGE_BYTES:
                    raise ImageFetchError(f"{field}: the image is larger than "
                                          f"{MAX_IMAGE_BYTES >> 20} MiB")
            return bytes(data)
    except ImageFetchError:
        raise
    except Exception as exc:  # the client's many transport errors
        raise ImageFetchError(f"{field}: the image could not be fetched ({exc})") from None
