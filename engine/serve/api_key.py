"""``--api-key``: the bearer key checked on every route but ``/health``, the API's own
description (``/openapi.json``, ``/docs``, ``/redoc``) and ``/metrics`` included: they
tell a stranger which model runs, how busy it is and what it accepts.

``/health`` stays open: a liveness probe (a container's, a load balancer's) carries no
key, and it says no more than that the server is up and which model it serves.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse, JSONResponse

from engine.serve.errors import APIError

OPENAPI_URL, DOCS_URL, REDOC_URL = "/openapi.json", "/docs", "/redoc"
# FastAPI's own routes for these carry no dependency: the app is made without them
# (FastAPI(**NO_BUILTIN_DOCS)) and add_docs puts them back behind the key.
NO_BUILTIN_DOCS = {"openapi_url": None, "docs_url": None, "redoc_url": None}


def key_check(api_key: str | None) -> Callable[[Request], None]:
    """The dependency that refuses a request without ``Authorization: Bearer <key>``
    (a 401); it lets everything through when the server has no key."""
    expected = api_key.encode() if api_key is not None else None

    def check_key(request: Request) -> None:
        if expected is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # compare_digest: the time taken must not tell how much of a guess was right.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), expected):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer "
                           "<key>' with the key the server was started with",
                           "invalid_api_key")

    return check_key


def add_docs(app: FastAPI, check_key: Callable[[Request], None]) -> None:
    """FastAPI's description routes, behind the key. A browser sends no key, so with a
    key set the pages are for tools that do (the schema for a client generator)."""
    keyed = [Depends(check_key)]
    redirect = DOCS_URL + "/oauth2-redirect"

    @app.get(OPENAPI_URL, include_in_schema=False, dependencies=keyed)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get(DOCS_URL, include_in_schema=False, dependencies=keyed)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=OPENAPI_URL, title=f"{app.title} - Swagger UI",
                                   oauth2_redirect_url=redirect)

    @app.get(redirect, include_in_schema=False, dependencies=keyed)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False, dependencies=keyed)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=OPENAPI_URL, title=f"{app.title} - ReDoc")
