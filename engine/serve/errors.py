"""Errors as OpenAI shapes them: ``{"error": {"message", "type", "param", "code"}}`` with
the HTTP status a client library turns into the right exception. No request ever gets a
traceback: anything unexpected is logged and answered as a 500 error object."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.serve import unicode_text
from engine.serve.disconnect import ClientGone

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error",
          422: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
          503: "server_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}


# As OpenAI types them, where that differs from the status's type.
_CODE_TYPES = {"model_not_found": "invalid_request_error"}


def error_body(status: int, message: str, code: str | None = None,
               param: str | None = None) -> dict:
    kind = _CODE_TYPES.get(code) or _TYPES.get(status, "server_error")
    return {"error": {"message": message, "type": kind,
                      "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error_body(error.status, error.message, error.code, error.param),
                        status_code=error.status, headers=error.headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def on_api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return error_response(APIError(400, "the request body is not valid JSON",
                                           "invalid_json"))
        surrogate = [e for e in errors if e.get("type") == unicode_text.ERROR_TYPE]
        if surrogate:
            # Not a 500 from the tokenizer: the client sent text that is not Unicode.
            field = surrogate[0]["ctx"]["field"]
            return error_response(APIError(400, surrogate[0]["msg"], "invalid_value", field))
        first = errors[0] if errors else {}
        if tuple(first.get("loc", ())) == ("body",):
            return error_response(APIError(400, "the request body must be a JSON object",
                                           "invalid_body"))
        unknown = [e for e in errors if e.get("type") == "extra_forbidden"]
        if unknown:
            # Refused, not dropped: a field Folio ignored could change what the client
            # expects of the reply (engine/serve/fields.py).
            where = _where(unknown[0])
            return error_response(APIError(400, f"{where} is not a field Folio knows (an "
                                           "OpenAI field it does not implement, or a typo); "
                                           "remove it", "unsupported_parameter", where))
        where = _where(first)
        message = first.get("msg", "invalid request")
        return error_response(APIError(422, f"{where}: {message}" if where else message,
                                       "invalid_value", where or None))

    @app.exception_handler(ClientGone)
    async def on_client_gone(request: Request, exc: ClientGone) -> Response:
        # The request is cancelled by now (disconnect.py); nobody reads this answer.
        log.info("%s %s: %s; cancelled it", request.method, request.url.path, exc)
        return Response(status_code=499)  # nginx's "client closed request"

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, RecursionError):
            # FastAPI's "error parsing the body" would not say what to change.
            return error_response(APIError(400, "the request body is nested too deeply "
                                           "(objects and arrays inside one another) to be "
                                           "read", "invalid_body"))
        return error_response(APIError(exc.status_code, str(exc.detail),
                                       headers=dict(exc.headers or {})))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("request %s %s failed", request.method, request.url.path)
        return error_response(APIError(500, f"internal error: {type(exc).__name__}"))


def _where(error: dict) -> str:
    return ".".join(str(p) for p in error.get("loc", ()) if p != "body")
