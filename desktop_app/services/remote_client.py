"""The OpenAI client on a remote server: building it, listing models, and turning its
failures into one paragraph a person can act on ("could not be reached", "answered 401").

The API key goes only into the Authorization header, never into an error message.
"""

from __future__ import annotations

from dataclasses import dataclass

import openai

from desktop_app.data.servers import normalize_base_url

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 300.0  # a long prompt on a busy server can take a while to start
NO_KEY = "no-key"  # the client needs a string; a server without a key ignores it


class RemoteError(OSError):
    """A server that cannot be reached or refused; the message is for a dialog."""


@dataclass(slots=True, frozen=True)
class ModelCard:
    id: str
    max_model_len: int | None = None


def make_client(base_url: str, api_key: str = "", read_timeout: float = READ_TIMEOUT_S
                ) -> openai.OpenAI:
    """The official client on this server; never the environment's OPENAI_API_KEY."""
    timeout = openai.Timeout(read_timeout, connect=CONNECT_TIMEOUT_S)
    return openai.OpenAI(base_url=base_url, api_key=api_key or NO_KEY, max_retries=0,
                         timeout=timeout)


def describe_failure(exc: BaseException, base_url: str, midway: bool = False) -> str:
    """One paragraph saying what went wrong with the server at base_url."""
    where = f"The server at {base_url}"
    if isinstance(exc, openai.APIStatusError):
        hint = {401: " Check the API key.", 403: " Check the API key.",
                404: " Check the URL (it usually ends in /v1) and the model name."}
        detail = _error_detail(exc.body) or exc.message
        return (f"{where} answered {exc.status_code}: {detail}."
                f"{hint.get(exc.status_code, '')}").replace("..", ".")
    if isinstance(exc, openai.APITimeoutError):
        return f"{where} could not be reached: it did not answer in time."
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        reason = str(cause).strip() if cause is not None else ""
        reason = reason or (type(cause).__name__ if cause is not None else "connection error")
        lost = "the connection was lost mid-reply" if midway else "no connection"
        return (f"{where} could not be reached ({lost}: {reason}). Check that the server "
                "is running and the URL is right.")
    if isinstance(exc, openai.APIError):  # an error event inside the stream
        return f"{where} reported an error: {exc.message}"
    return f"{where} failed: {type(exc).__name__}: {exc}"


def _error_detail(body: object) -> str:
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            for key in ("message", "detail"):
                if isinstance(inner.get(key), str):
                    return inner[key].strip()
        if isinstance(inner, str):
            return inner.strip()
        if isinstance(body.get("detail"), str):
            return body["detail"].strip()
    return ""


def list_models(base_url: str, api_key: str = "") -> list[ModelCard]:
    """The models a server serves (``GET /v1/models``); raises RemoteError."""
    base_url = normalize_base_url(base_url)
    client = make_client(base_url, api_key, read_timeout=15.0)
    try:
        page = client.models.list()
        cards = []
        for model in page.data:
            length = getattr(model, "max_model_len", None)
            if length is None and model.model_extra:
                length = model.model_extra.get("max_model_len")
            ok = isinstance(length, int) and not isinstance(length, bool) and length > 0
            cards.append(ModelCard(model.id, length if ok else None))
    except openai.OpenAIError as exc:
        raise RemoteError(describe_failure(exc, base_url)) from None
    except ValueError as exc:  # a body that is not the OpenAI shape
        raise RemoteError(f"The server at {base_url} did not answer like an "
                          f"OpenAI-compatible API: {exc}") from None
    finally:
        client.close()
    if not cards:
        raise RemoteError(f"The server at {base_url} serves no models.")
    return cards
