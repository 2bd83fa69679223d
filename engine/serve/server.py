"""Running the API: the loopback-only default, and uvicorn in the foreground (``folio
serve``) or on a background thread (the desktop app's "serve" switch, tests, the bench).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from dataclasses import dataclass

from engine.serve.app import ServeSettings, create_app
from engine.serve.slow_clients import head_timeout_protocol
from engine.worker import EngineWorker

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


class UnsafeHostError(ValueError):
    """A server reachable from other machines, with no API key to keep strangers out."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_host(host: str, api_key: str | None) -> None:
    """Refuse to listen beyond this machine without a key."""
    if not is_loopback(host) and not api_key:
        raise UnsafeHostError(
            f"--host {host} makes the API reachable from other machines, and without "
            "--api-key anyone who reaches it can use the model; pass --api-key KEY "
            f"(clients then send 'Authorization: Bearer KEY'), or keep {DEFAULT_HOST}")


def check_port_free(port: int, host: str = DEFAULT_HOST) -> None:
    """Raise OSError naming the port when something already listens on it (uvicorn itself
    would only log the failure and exit). Every address ``host`` resolves to is tried, in
    its own family, as asyncio's create_server binds them all: an IPv6 host needs an IPv6
    socket."""
    for family, address in _addresses(host, port):
        with _socket(family) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                sock.bind(address)
            except OSError as exc:
                raise OSError(f"port {port} on {host} is already in use "
                              f"({exc.strerror or exc})") from None


def free_port(host: str = DEFAULT_HOST) -> int:
    family, address = _addresses(host, 0)[0]
    with _socket(family) as sock:
        sock.bind(address)
        return sock.getsockname()[1]


def _addresses(host: str, port: int) -> list[tuple[int, tuple]]:
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {host}: the address does not resolve "
                      f"({exc.strerror or exc})") from None
    return list(dict.fromkeys((family, address) for family, _, _, _, address in found))


def _socket(family: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_INET6:
        # As create_server: "::" then binds IPv6 only, and is not taken by 0.0.0.0.
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    return sock


def _uvicorn_server(worker: EngineWorker, host: str, port: int, settings: ServeSettings):
    import uvicorn

    config = uvicorn.Config(create_app(worker, settings, host), host=host, port=port,
                            log_level="warning", access_log=False, lifespan="off",
                            http=head_timeout_protocol(settings.head_timeout_s),
                            limit_concurrency=settings.limit_concurrency,
                            timeout_keep_alive=settings.keep_alive_s)
    return uvicorn.Server(config)


def serve_forever(worker: EngineWorker, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                  settings: ServeSettings | None = None) -> None:
    """Serve until interrupted (Ctrl+C ends uvicorn cleanly)."""
    settings = settings or ServeSettings()
    check_host(host, settings.api_key)
    check_port_free(port, host)
    _uvicorn_server(worker, host, port, settings).run()


@dataclass(slots=True)
class BackgroundServer:
    """uvicorn on a daemon thread; ``stop`` shuts it down and waits for the thread."""

    host: str
    port: int
    _server: object
    _thread: threading.Thread

    @property
    def app(self):
        """The FastAPI app (its ``state.metrics`` holds the server's counters)."""
        return self._server.config.app

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)


def start_in_background(worker: EngineWorker, host: str = DEFAULT_HOST, port: int = 0,
                        settings: ServeSettings | None = None,
                        timeout: float = 30.0) -> BackgroundServer:
    """Start serving on a thread and return once the port accepts connections; port 0
    picks a free one. Raises OSError, naming the port, when it cannot be bound."""
    settings = settings or ServeSettings()
    check_host(host, settings.api_key)
    if port:
        check_port_free(port, host)
    port = port or free_port(host)
    server = _uvicorn_server(worker, host, port, settings)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            server.run()
        except BaseException as exc:  # SystemExit when uvicorn cannot bind
            errors.append(exc)

    thread = threading.Thread(target=run, name="folio-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if errors or not thread.is_alive():
            raise OSError(f"cannot serve on {host}:{port}: "
                          f"{errors[0] if errors else 'the server stopped'}")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise OSError(f"the server on {host}:{port} did not start in {timeout:.0f} s")
        time.sleep(0.02)
    return BackgroundServer(host, port, server, thread)
