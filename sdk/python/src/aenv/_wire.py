"""What both HTTP layers share: the endpoint, requests and responses."""

from __future__ import annotations

import ssl
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional


@dataclass(frozen=True)
class Endpoint:
    """Where the server is: scheme, host, port and an optional path prefix."""

    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, base_url: str) -> "Endpoint":
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url {base_url!r} must be http://host[:port] or https://...")
        port = u.port or (443 if u.scheme == "https" else 80)
        return cls(u.scheme, u.hostname, port, u.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def ssl_context(self) -> Optional[ssl.SSLContext]:
        return ssl.create_default_context() if self.scheme == "https" else None


@dataclass
class Request:
    """One HTTP request. target is the path with its query string."""

    method: str
    target: str
    headers: Dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    # idempotent requests may be sent again after a connection failure.
    idempotent: bool = False
    # timeout in seconds for this request, connect to last byte.
    timeout: Optional[float] = None
    # on_body, when set, is handed a success's body piece by piece as it
    # arrives (a stream), instead of the body being kept in the Response;
    # what it returns, if awaitable, the async client awaits.
    on_body: Optional[Callable[[bytes], Any]] = None


@dataclass
class Response:
    status: int
    headers: Dict[str, str]  # lower-case names; repeated headers joined by ", "
    body: bytes

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)
