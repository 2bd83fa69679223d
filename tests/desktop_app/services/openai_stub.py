"""A tiny OpenAI-compatible server for the remote-model tests: canned words streamed as
chat-completion chunks (HTTP/1.1, chunked), with knobs for what real servers do wrong:
ignore ``n``, refuse ``n > 1``, stream until the client leaves, drop the connection
mid-reply, or run one request at a time (``one_at_a_time``: a new request cuts the running
stream short with ``[DONE]`` and waits for it, as llama-cpp-python's server does with its
default interrupt_requests; ``busy``: a request that comes while another streams gets a
503). It records every request body, whether clients went away, how many streams ran at
once at most, and how many it cut."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="stub-model"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="stub-model"} 1.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="stub-model"} 0.25
# HELP vllm:gpu_prefix_cache_hit_rate GPU prefix cache block hit rate.
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{model_name="stub-model"} 0.5
"""


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # clients that leave mid-stream are what the tests do on purpose


class StubServer:
    def __init__(self, model: str = "stub-model", api_key: str | None = None,
                 max_model_len: int | None = 4096, max_choices: int | None = None,
                 refuse_n: bool = False, words: int = 5, delay_s: float = 0.0,
                 forever: bool = False, die_after: int | None = None,
                 metrics: str | None = VLLM_METRICS, one_at_a_time: bool = False,
                 busy: bool = False) -> None:
        self.model, self.api_key, self.max_model_len = model, api_key, max_model_len
        self.max_choices, self.refuse_n = max_choices, refuse_n
        self.words, self.delay_s, self.forever, self.die_after = words, delay_s, forever, \
            die_after
        self.metrics = metrics
        self.one_at_a_time, self.busy = one_at_a_time, busy
        self.running = self.most_running = self.cuts = 0
        self._count_lock = threading.Lock()
        self._turn = threading.Lock()  # the one request that runs, with one_at_a_time
        self._interrupt = threading.Event()
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.disconnected = threading.Event()
        self.streaming = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path == "/metrics" and stub.metrics is not None:
                    self._send(200, stub.metrics, "text/plain; version=0.0.4")
                elif self.path == "/v1/models" and self._authorized():
                    card = {"id": stub.model, "object": "model", "owned_by": "stub"}
                    if stub.max_model_len:
                        card["max_model_len"] = stub.max_model_len
                    self._json(200, {"object": "list", "data": [card]})
                elif self.path != "/v1/models":
                    self._json(404, {"detail": "Not Found"})

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                stub.bodies.append(body)
                stub.headers.append(dict(self.headers))
                if not self._authorized():
                    return
                n = body.get("n", 1)
                if stub.refuse_n and n > 1:
                    self._json(400, {"object": "error", "message": "n > 1 is not supported",
                                     "type": "BadRequestError"})
                    return
                choices = n if stub.max_choices is None else min(n, stub.max_choices)
                if stub.busy and stub.running:
                    self._json(503, {"error": {"message": "the server is busy: one request at "
                                               "a time", "type": "server_error"}})
                elif stub.one_at_a_time:
                    stub._interrupt.set()  # the running stream stops at its next word
                    with stub._turn:
                        stub._interrupt.clear()
                        self._stream(body, choices)
                else:
                    self._stream(body, choices)

            def _authorized(self) -> bool:
                if stub.api_key is None:
                    return True
                if self.headers.get("authorization") == f"Bearer {stub.api_key}":
                    return True
                self._json(401, {"error": {"message": "invalid API key", "type":
                                           "authentication_error", "code": "invalid_api_key"}})
                return False

            def _stream(self, body: dict, choices: int) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                seed = body.get("seed")
                tag = f"s{seed}" if seed is not None else ""
                with stub._count_lock:
                    stub.running += 1
                    stub.most_running = max(stub.most_running, stub.running)
                try:
                    step = 0
                    stub.streaming.set()
                    while stub.forever or step < stub.words:
                        if stub.one_at_a_time and stub._interrupt.is_set():
                            stub.cuts += 1
                            self._raw(b"data: [DONE]\n\n")  # no finish reason: cut short
                            self.wfile.write(b"0\r\n\r\n")
                            return
                        if stub.die_after is not None and step >= stub.die_after:
                            self.wfile.flush()
                            self.close_connection = True
                            self.connection.shutdown(2)  # no terminating chunk: cut short
                            return
                        for i in range(choices):
                            word = f"{' ' if step else ''}c{i}w{step}{tag}"
                            self._chunk([{"index": i, "delta": {"content": word},
                                          "finish_reason": None}])
                        step += 1
                        time.sleep(stub.delay_s)
                    self._chunk([{"index": i, "delta": {}, "finish_reason": "length"}
                                 for i in range(choices)])
                    self._chunk([], usage={"prompt_tokens": 11, "completion_tokens":
                                           step * choices, "total_tokens": 11 + step * choices,
                                           "prompt_tokens_details": {"cached_tokens": 3}})
                    self._raw(b"data: [DONE]\n\n")
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:  # the client went away
                    stub.disconnected.set()
                    self.close_connection = True
                finally:
                    with stub._count_lock:
                        stub.running -= 1

            def _chunk(self, choices: list, usage: dict | None = None) -> None:
                data = {"id": "chatcmpl-stub", "object": "chat.completion.chunk",
                        "created": 0, "model": stub.model, "choices": choices}
                if usage is not None:
                    data["usage"] = usage
                self._raw(f"data: {json.dumps(data)}\n\n".encode())

            def _raw(self, payload: bytes) -> None:
                self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
                self.wfile.flush()

            def _json(self, status: int, data: dict) -> None:
                self._send(status, json.dumps(data), "application/json")

            def _send(self, status: int, text: str, content_type: str) -> None:
                payload = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
