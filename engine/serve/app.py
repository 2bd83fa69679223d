"""The OpenAI-compatible HTTP API over one EngineWorker, or over every model of a library
loaded on demand by a ModelHost (``create_app``; models.py).

Routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``
(streamed as server-sent events or not), ``POST /v1/embeddings`` (embeddings.py), ``GET
/health``, ``GET /metrics``, ``GET /v1/status`` (the models loaded, their memory and idle
time) and the API's description (``api_key.py``: all but ``/health`` behind the key, when
there is one). Requests join
their model worker's continuous batch like the app's chats do, so they share its prefix
cache: a client that sends a conversation again finds its earlier turns cached, and
``usage.prompt_tokens_details.cached_tokens`` says how many. Chat requests with tools, or
with tool calls and results in their history, are built by the engine's prompt builder
(``engine/chat``) here, off the event loop; the engine reads each reply (thinking, text,
tool calls) and this module only shapes what it hands over (``responses.py``).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import dataclass

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from engine.embeddings import Embedder, embedding_model
from engine.grammar import GrammarBusy, GrammarError
from engine.outputs import ErrorEvent, FinishedEvent
from engine.serve import responses
from engine.serve.api_key import NO_BUILTIN_DOCS, add_docs, key_check
from engine.serve.beam import beam_search_params
from engine.serve.disconnect import DisconnectWatch
from engine.serve.embeddings import add_embeddings
from engine.serve.errors import APIError, install_error_handlers
from engine.serve.host_guard import AccessPolicy, HostGuard
from engine.serve.image_urls import fetch_image_urls
from engine.serve.limits import BodySizeLimit
from engine.serve.logprobs import TokenTexts
from engine.serve.metrics import CONTENT_TYPE, ServerMetrics
from engine.serve.models import HostedModels, OneModel, release
from engine.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    InvalidField,
    SamplingFields,
    UnsupportedField,
)
from engine.serve.streaming import RequestStream
from engine.worker import EngineWorker

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(slots=True)
class ServeSettings:
    api_key: str | None = None  # None: no key asked (loopback only, see server.py)
    max_body_bytes: int = 20 << 20  # an image sent as a data: URL is about 4/3 of its file
    # Requests submitted but not yet streaming; past it new ones get 429, so a flood
    # queues in the clients, not in this process's memory.
    max_waiting: int = 64
    retry_after_s: int = 1
    # Names beyond the bound address and loopback that clients may send as Host, and the
    # browser origins that get CORS headers (engine/serve/host_guard.py): none by default.
    # Comma-separated text or a sequence; kept as a tuple.
    allowed_hosts: tuple[str, ...] | str = ()
    allowed_origins: tuple[str, ...] | str = ()
    # Open connections (idle keep-alive ones too) past which a request gets uvicorn's
    # 503: room for max_waiting plus a full batch of streams, and idle clients beside.
    limit_concurrency: int = 256
    # A connection whose request head (request line and headers) has not arrived this
    # long after it opened, or after the head's first byte, is closed (slow_clients.py).
    head_timeout_s: float = 10.0
    keep_alive_s: float = 5.0  # an idle connection between requests is closed after it
    # http(s) image URLs fetched by the server (image_urls.py); off: data: URLs only.
    allow_image_urls: bool = False
    # The embedding model /v1/embeddings answers with (a folder or .gguf file,
    # embeddings.py); None: that route is a 404.
    embedding_model: str | None = None

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {self.max_waiting}")
        if self.limit_concurrency < 2:
            raise ValueError(f"limit_concurrency must be >= 2, got {self.limit_concurrency}")
        for name in ("head_timeout_s", "keep_alive_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        policy = self.policy("127.0.0.1")  # a bad name or origin fails here, not later
        self.allowed_hosts, self.allowed_origins = policy.allowed_hosts, policy.allowed_origins

    def policy(self, bind: str) -> AccessPolicy:
        return AccessPolicy(bind, self.allowed_hosts, self.allowed_origins)

    def embedder(self) -> Embedder | None:
        """The embedding model, loaded once per process; a ValueError naming the setting
        for a path that is not one."""
        return embedding_model(self.embedding_model)


def create_app(worker: EngineWorker | OneModel | HostedModels,
               settings: ServeSettings | None = None, host: str = "127.0.0.1") -> FastAPI:
    """``worker``: the one model served, or the models (HostedModels); ``host``: the
    address the app is served on, which clients may send as Host."""
    settings = settings or ServeSettings()
    models = OneModel(worker) if isinstance(worker, EngineWorker) else worker
    metrics = ServerMetrics(models.metric_families)
    # Each model's token texts, read on its first request with logprobs.
    token_texts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def texts_of(lease) -> TokenTexts:
        if lease.worker not in token_texts:
            token_texts[lease.worker] = TokenTexts(lease.worker.llm.tokenizer)
        return token_texts[lease.worker]
    app = FastAPI(title="Folio", version="1", summary="OpenAI-compatible API of a Folio engine",
                  **NO_BUILTIN_DOCS)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    # Added last, so it runs first: a foreign Host is refused before the body is read.
    app.add_middleware(HostGuard, policy=settings.policy(host))
    install_error_handlers(app)
    app.state.metrics = metrics

    check_key = key_check(settings.api_key)
    add_docs(app, check_key)
    add_embeddings(app, settings.embedder(), check_key, settings.embedding_model)

    @app.get("/health")  # open with a key too: liveness probes send none (api_key.py)
    async def health() -> dict:
        return {"status": "ok", "model": models.default_name}

    @app.get("/metrics", dependencies=[Depends(check_key)])
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", dependencies=[Depends(check_key)])
    async def list_models() -> dict:
        return {"object": "list", "data": await asyncio.to_thread(models.cards)}

    @app.get("/v1/status", dependencies=[Depends(check_key)])
    async def status() -> dict:
        return models.status()

    @app.post("/v1/chat/completions", dependencies=[Depends(check_key)])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        params = _params(body, None)  # no limit: up to the context, as OpenAI's
        try:
            chat = body.chat_request()
        except InvalidField as exc:
            raise _invalid(exc) from exc
        if params.response_format is not None and chat.tools.active:
            raise APIError(400, "response_format: a reply constrained to JSON cannot also "
                           "call tools; set tool_choice 'none' or drop response_format",
                           "invalid_value", "response_format")
        lease = await models.lease(body.model, body.keep_alive)  # loads it if needed
        try:
            llm = lease.worker.llm
            try:
                # The engine's one prompt builder, off the event loop: a long history takes
                # a while to render and tokenize. The engine runs these ids as they are.
                if settings.allow_image_urls:
                    chat = await asyncio.to_thread(fetch_image_urls, chat)
                prompt = await asyncio.to_thread(llm.engine.prompts.build, chat)
            except InvalidField as exc:
                raise _invalid(exc) from exc
            except ValueError as exc:
                raise APIError(400, str(exc), "invalid_value", "messages") from exc
            params = prompt.sampling(params)
            beam = _beam(body, params, chat.tools.active, llm.max_model_len - len(prompt.ids))
            grammar = await _check_format(llm, params.response_format,
                                          "tools" if prompt.call_format else "response_format")
        except BaseException:
            await release(lease)
            raise
        return await _complete(body, prompt, beam or params, "chat", request, lease, grammar)

    async def _check_format(llm, fmt, field: str):
        """The compiled grammar, compiled before anything is queued: a schema the engine
        cannot enforce (or too large, or too slow to compile) is a 400 naming what, and the
        engine's thread gets the grammar ready. The checks run off the event loop; the
        compile is awaited, so slow schemas do not hold the loop's worker threads."""
        if fmt is None:
            return None
        try:
            compiling = await asyncio.to_thread(llm.engine.grammars.start, fmt)
            return await compiling.wait()
        except GrammarError as exc:
            raise APIError(400, f"{field}: {exc}", "invalid_value", field) from exc
        except GrammarBusy as exc:
            raise APIError(429, f"{field}: {exc}", "server_busy", field,
                           {"Retry-After": str(settings.retry_after_s)}) from exc

    @app.post("/v1/completions", dependencies=[Depends(check_key)])
    async def completions(body: CompletionRequest, request: Request) -> Response:
        params = _params(body, COMPLETIONS_DEFAULT_MAX_TOKENS)
        params = _beam(body, params) or params
        lease = await models.lease(body.model, body.keep_alive)  # loads it if needed
        return await _complete(body, body.prompt, params, "text", request, lease)

    async def _complete(body, prompt, params, kind: str, request: Request, lease,
                        grammar=None) -> Response:
        """Runs the request on `lease`'s model, and ends the lease when it is done."""
        if metrics.waiting >= settings.max_waiting:
            await release(lease)
            metrics.requests.labels(kind, "rejected_busy").inc()
            raise APIError(429, f"the server has {metrics.waiting} requests waiting; retry "
                           "shortly", "server_busy",
                           headers={"Retry-After": str(settings.retry_after_s)})
        stream = RequestStream(lease.worker, prompt, params, grammar, on_close=lease.release)
        await stream.__aenter__()
        watch = DisconnectWatch(request, stream.request_id)
        metrics.waiting += 1
        try:
            first = await watch.wait_for(stream.next_event())
        except BaseException:
            watch.close()
            await stream.__aexit__(None, None, None)
            raise
        finally:
            metrics.waiting -= 1
        if isinstance(first, ErrorEvent):
            watch.close()
            await stream.__aexit__(None, None, None)
            metrics.requests.labels(kind, "rejected" if first.rejected else "failed").inc()
            raise APIError(400 if first.rejected else 500, first.message)
        shape = responses.Shape(kind, stream.request_id, lease.name, int(time.time()))
        if body.stream:
            # The streaming response watches the connection itself.
            watch.close()
            return responses.EventStream(stream, first, shape, body.include_usage,
                                         lambda out: metrics.finished(kind, out), metrics,
                                         texts_of(lease))
        metrics.running += 1
        try:
            output = await _collect(stream, first, watch)
        finally:
            metrics.running -= 1
            watch.close()
            await stream.__aexit__(None, None, None)
        metrics.finished(kind, output)
        return JSONResponse(responses.completion_body(shape, output, texts_of(lease)))

    return app


def _params(body: SamplingFields, max_tokens_default: int | None):
    try:
        return body.sampling_params(max_tokens_default)
    except UnsupportedField as exc:
        raise APIError(400, str(exc), "unsupported_parameter", exc.field) from exc
    except InvalidField as exc:
        raise _invalid(exc) from exc
    except ValueError as exc:
        raise APIError(422, str(exc), "invalid_value") from exc


def _beam(body: SamplingFields, params, tools: bool = False, room: int | None = None):
    """``body``'s beam search (BeamSearchParams), None where it asks for none."""
    try:
        return beam_search_params(body, params, tools, room)
    except UnsupportedField as exc:
        raise APIError(400, str(exc), "unsupported_parameter", exc.field) from exc
    except InvalidField as exc:
        raise _invalid(exc) from exc


def _invalid(exc: InvalidField) -> APIError:
    return APIError(400, str(exc), "invalid_value", exc.field)


async def _collect(stream: RequestStream, first, watch: DisconnectWatch):
    """The finished output (the engine read the reply: its message is in the output)."""
    event = first
    while not isinstance(event, FinishedEvent):
        if isinstance(event, ErrorEvent):
            raise APIError(500, event.message)
        event = await watch.wait_for(stream.next_event())
    return event.output
