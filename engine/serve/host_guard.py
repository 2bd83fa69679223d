"""Who may talk to the API from a browser: the ``Host`` header and the ``Origin`` header.

A web page cannot name a loopback server, but it can rebind its own DNS name to 127.0.0.1
(DNS rebinding, Ollama's CVE-2024-28224): the browser then sends the page's name as
``Host`` and treats the replies as same-origin, so the page could chat with the model and
read the answers. ``HostGuard`` answers 403 to any request whose ``Host`` is not a name
this server is served under, before any route (streaming ones included) runs:

- ``localhost``, ``127.0.0.1``, ``[::1]`` and the ``--host`` given, with any port or none.
  The port is not checked: a page picks the name, never the port, and port forwards
  (``ssh -L 9000:localhost:8000``, ``docker -p``) change the port a client sends.
- On a wildcard bind (``0.0.0.0``, ``::``) any IP literal too: the server answers on
  every address of the machine, and an address is no name an attacker can rebind.
- Names passed with ``--allowed-hosts`` (a LAN name, ``box.local``, a reverse proxy's).
- A request without ``Host`` (HTTP/1.0): no browser sends one.

CORS: a cross-origin request (an ``Origin`` other than the server's own) is refused with
403 unless its origin is in ``--allowed-origins`` (none by default, as Ollama's
``OLLAMA_ORIGINS``); allowed ones get CORS headers, and their preflight ``OPTIONS`` is
answered here. Refusing, rather than only withholding the headers, means a page's
"simple" request (which needs no preflight) is not even run.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from dataclasses import dataclass, field

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse, Response

from engine.serve.errors import error_body

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")
_HOST_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?$")
_ORIGIN = re.compile(r"^[a-z][a-z0-9+.-]*://[^/?#\s]+$")
_PREFLIGHT_MAX_AGE_S = "600"


def host_name(header: str) -> str | None:
    """The name part of a ``Host`` header, lower-cased, without port or brackets; None when
    the header is malformed."""
    header = header.strip().lower()
    if header.startswith("["):
        name, bracket, rest = header[1:].partition("]")
        if not bracket:
            return None
    else:
        name, colon, port = header.partition(":")
        rest = colon + port
    if rest and not (rest[0] == ":" and rest[1:].isdigit() or rest == ":"):
        return None
    return name.rstrip(".") or None


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _bare(name: str) -> str:
    return name.strip().lower().strip("[]").rstrip(".")


def _split(values) -> tuple[str, ...]:
    """Comma-separated text or a sequence of names, stripped, empty ones dropped."""
    if isinstance(values, str):
        values = values.split(",")
    return tuple(v.strip() for v in values if v and v.strip())


@dataclass(slots=True, frozen=True)
class AccessPolicy:
    """The Hosts and Origins a server accepts; ``bind`` is the address it listens on.
    ``allowed_hosts`` / ``allowed_origins``: comma-separated text or a sequence."""

    bind: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    _names: frozenset[str] = field(init=False, repr=False, compare=False)
    _addresses: frozenset = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        hosts = tuple(_bare(h) for h in _split(self.allowed_hosts))
        for name in hosts:
            if _address(name) is None and not _HOST_NAME.match(name):
                raise ValueError(f"allowed_hosts: {name!r} is not a host name (give names "
                                 "without scheme or port, e.g. box.local)")
        origins = tuple(o.lower().rstrip("/") for o in _split(self.allowed_origins))
        for origin in origins:
            if origin not in ("*", "null") and not _ORIGIN.match(origin):
                raise ValueError(f"allowed_origins: {origin!r} is not an origin (write "
                                 "scheme://host[:port], e.g. http://localhost:3000, or a "
                                 "pattern such as http://localhost:*)")
        names = {_bare(n) for n in (*LOOPBACK_NAMES, self.bind, *hosts)} - set(WILDCARDS)
        set_ = object.__setattr__  # frozen: the normalised forms, set once
        set_(self, "allowed_hosts", hosts)
        set_(self, "allowed_origins", origins)
        set_(self, "_names", frozenset(names))
        set_(self, "_addresses", frozenset(a for a in map(_address, names) if a is not None))

    @property
    def wildcard(self) -> bool:
        return _bare(self.bind) in WILDCARDS

    def host_allowed(self, header: str | None) -> bool:
        if header is None:
            return True
        name = host_name(header)
        if name is None:
            return False
        address = _address(name)
        if address is not None:
            return self.wildcard or address in self._addresses
        return name in self._names

    def origin_allowed(self, origin: str) -> bool:
        origin = origin.lower().rstrip("/")
        return any(fnmatch.fnmatchcase(origin, pattern) for pattern in self.allowed_origins)


def _same_origin(origin: str, host: str | None) -> bool:
    # A page this server itself served (FastAPI's /docs) sends its own origin.
    return host is not None and origin.lower() in (f"http://{host.lower()}",
                                                    f"https://{host.lower()}")


class HostGuard:
    """ASGI middleware applying an ``AccessPolicy`` to every request."""

    def __init__(self, app, policy: AccessPolicy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host, origin = headers.get("host"), headers.get("origin")
        cross_origin = origin is not None and not _same_origin(origin, host)
        refusal = self._refusal(host, origin if cross_origin else None)
        if refusal is not None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            else:
                await JSONResponse(error_body(403, *refusal), status_code=403)(
                    scope, receive, send)
            return
        if not cross_origin or scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await _preflight(origin, headers)(scope, receive, send)
            return

        async def send_with_cors(message) -> None:
            if message["type"] == "http.response.start":
                response_headers = MutableHeaders(scope=message)
                response_headers["Access-Control-Allow-Origin"] = origin
                response_headers.add_vary_header("Origin")
            await send(message)

        await self.app(scope, receive, send_with_cors)

    def _refusal(self, host: str | None, cross_origin: str | None) -> tuple[str, str] | None:
        """(message, code) of the 403, or None when the request may go on."""
        if not self.policy.host_allowed(host):
            hint = ("; start the server with --allowed-hosts NAME to serve under that name"
                    if host_name(host or "") else "")
            return (f"Host {host!r} is not a name this server is served under{hint}",
                    "host_not_allowed")
        if cross_origin is not None and not self.policy.origin_allowed(cross_origin):
            return (f"cross-origin requests from {cross_origin!r} are not allowed; start "
                    f"the server with --allowed-origins {cross_origin} to allow them",
                    "origin_not_allowed")
        return None


def _preflight(origin: str, headers: Headers) -> Response:
    cors = {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
            "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
            "Access-Control-Max-Age": _PREFLIGHT_MAX_AGE_S}
    wanted = headers.get("access-control-request-headers")
    if wanted:  # whatever the page asks for: the openai JS client adds x-stainless-* ones
        cors["Access-Control-Allow-Headers"] = wanted
    return Response(status_code=204, headers=cors)
