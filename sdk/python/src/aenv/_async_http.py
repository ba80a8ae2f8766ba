"""A small HTTP/1.1 client on asyncio streams with a keep-alive pool.

One pool per client: at most max_connections sockets to the server, idle
ones reused last-in first-out, callers beyond the limit queue in order.
That is what lets one event loop drive hundreds of sandboxes at once
without opening hundreds of sockets per second.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._wire import Endpoint, Request, Response
from .errors import ClientClosed, Timeout, TransportError

_MAX_HEADER_LINE = 64 * 1024
_MAX_HEADERS = 200


class _StaleConnection(TransportError):
    """A reused connection was closed by the server before it answered."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.idle_since = time.monotonic()

    def reusable(self, idle_timeout: float) -> bool:
        # A server that closed an idle connection shows as EOF once the
        # loop has seen the FIN; checking here avoids most stale sends.
        if self.writer.is_closing() or self.reader.at_eof():
            return False
        return time.monotonic() - self.idle_since < idle_timeout

    def close(self) -> None:
        self.writer.close()


class AsyncConnectionPool:
    """Sends requests to one endpoint over pooled keep-alive connections."""

    def __init__(self, endpoint: Endpoint, max_connections: int = 100,
                 connect_timeout: float = 10.0, idle_timeout: float = 20.0):
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self._endpoint = endpoint
        self._ssl = endpoint.ssl_context()
        self._connect_timeout = connect_timeout
        self._idle_timeout = idle_timeout
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: List[_Connection] = []
        self._busy: set = set()
        self._closed = False
        # counters for tests and diagnostics
        self.connections_opened = 0

    async def send(self, req: Request) -> Response:
        """Sends req and reads the whole response.

        Raises Timeout when req.timeout passes, TransportError when the
        connection fails, ClientClosed after close().
        """
        if self._closed:
            raise ClientClosed("client is closed")
        async with self._slots:
            try:
                return await self._send_in_slot(req)
            except _StaleConnection as exc:
                if not req.idempotent:
                    raise TransportError(f"{req.method} {req.target}: connection closed by server before a response") from exc
                # The server closed a connection we reused; the request
                # is safe to send again on a fresh connection, once.
                return await self._send_in_slot(req, fresh=True)

    async def _send_in_slot(self, req: Request, fresh: bool = False) -> Response:
        conn = None if fresh else self._take_idle()
        reused = conn is not None
        try:
            async with asyncio.timeout(req.timeout):
                if conn is None:
                    conn = await self._connect()
                self._busy.add(conn)
                resp, keep_alive = await self._exchange(conn, req, reused)
        except TimeoutError as exc:
            if conn is not None:
                conn.close()
            raise Timeout(f"{req.method} {req.target}: no complete response within {req.timeout} s") from exc
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            if conn is not None:
                conn.close()
            raise TransportError(f"{req.method} {req.target}: {exc!r}") from exc
        except BaseException:
            # Cancelled mid-exchange: the connection is in an unknown state.
            if conn is not None:
                conn.close()
            raise
        finally:
            if conn is not None:
                self._busy.discard(conn)
        self._release(conn, keep_alive)
        return resp

    def _take_idle(self) -> Optional[_Connection]:
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable(self._idle_timeout):
                return conn
            conn.close()
        return None

    def _release(self, conn: _Connection, keep_alive: bool) -> None:
        if keep_alive and not self._closed:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()

    async def _connect(self) -> _Connection:
        ep = self._endpoint
        try:
            async with asyncio.timeout(self._connect_timeout):
                reader, writer = await asyncio.open_connection(
                    ep.host, ep.port, ssl=self._ssl, limit=_MAX_HEADER_LINE)
        except TimeoutError as exc:
            raise Timeout(f"connect to {ep.host}:{ep.port}: no answer within {self._connect_timeout} s") from exc
        except OSError as exc:
            raise TransportError(f"connect to {ep.host}:{ep.port}: {exc}") from exc
        self.connections_opened += 1
        return _Connection(reader, writer)

    async def _exchange(self, conn: _Connection, req: Request, reused: bool) -> Tuple[Response, bool]:
        try:
            conn.writer.write(_encode_head(self._endpoint, req) + req.body)
            await conn.writer.drain()
            status_line = await conn.reader.readline()
        except (ConnectionResetError, BrokenPipeError) as exc:
            if reused:
                raise _StaleConnection(f"{req.method} {req.target}: reused connection reset") from exc
            raise
        if not status_line:
            if reused:
                raise _StaleConnection(f"{req.method} {req.target}: reused connection closed")
            raise TransportError(f"{req.method} {req.target}: connection closed before a response")
        status, version = _parse_status_line(status_line)
        headers = await _read_headers(conn.reader)
        while 100 <= status < 200:  # interim responses; we never send Expect
            status, version = _parse_status_line(await conn.reader.readline())
            headers = await _read_headers(conn.reader)
        on_body = req.on_body if 200 <= status < 300 else None
        body, until_eof = await _read_body(conn.reader, req.method, status, headers, on_body)
        keep_alive = not until_eof and _wants_keep_alive(version, headers)
        return Response(status, headers, body), keep_alive

    async def close(self) -> None:
        """Closes idle connections now and busy ones when they finish."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        for conn in idle:
            try:
                await conn.writer.wait_closed()
            except OSError:
                pass


def _encode_head(ep: Endpoint, req: Request) -> bytes:
    lines = [f"{req.method} {ep.prefix}{req.target} HTTP/1.1", f"Host: {ep.host_header}"]
    for name, value in req.headers.items():
        if "\r" in value or "\n" in value:
            raise ValueError(f"header {name} contains a line break")
        lines.append(f"{name}: {value}")
    if req.body or req.method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(req.body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _parse_status_line(line: bytes) -> Tuple[int, str]:
    parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise TransportError(f"malformed HTTP status line {line[:100]!r}")
    return int(parts[1]), parts[0]


async def _read_headers(reader: asyncio.StreamReader) -> Dict[str, str]:
    headers: Dict[str, str] = {}
    for _ in range(_MAX_HEADERS):
        line = await reader.readline()
        if not line:
            raise TransportError("connection closed inside the response headers")
        if line in (b"\r\n", b"\n"):
            return headers
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise TransportError(f"malformed header line {line[:100]!r}")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    raise TransportError(f"more than {_MAX_HEADERS} response headers")


_STREAM_PIECE = 64 * 1024


async def _read_body(reader: asyncio.StreamReader, method: str, status: int,
                     headers: Dict[str, str],
                     on_body: Optional[Callable[[bytes], Any]] = None) -> Tuple[bytes, bool]:
    """Returns the body and whether it ran to the end of the connection.
    With on_body the body is handed to it as it arrives, and b"" returned."""
    if method == "HEAD" or status in (204, 304):
        return b"", False
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return await _read_chunked(reader, on_body), False
    length = headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise TransportError(f"bad Content-Length {length!r}")
        if on_body is None:
            return await reader.readexactly(int(length)), False
        left = int(length)
        while left > 0:
            piece = await reader.readexactly(min(left, _STREAM_PIECE))
            left -= len(piece)
            await _hand(on_body, piece)
        return b"", False
    if on_body is None:
        return await reader.read(), True
    while True:
        piece = await reader.read(_STREAM_PIECE)
        if not piece:
            return b"", True
        await _hand(on_body, piece)


async def _hand(on_body: Callable[[bytes], Any], piece: bytes) -> None:
    result = on_body(piece)
    if inspect.isawaitable(result):
        await result


async def _read_chunked(reader: asyncio.StreamReader,
                        on_body: Optional[Callable[[bytes], Any]] = None) -> bytes:
    parts = []
    while True:
        size_line = await reader.readline()
        size_text = size_line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise TransportError(f"malformed chunk size {size_line[:100]!r}") from None
        if size == 0:
            break
        chunk = await reader.readexactly(size)
        if on_body is None:
            parts.append(chunk)
        else:
            await _hand(on_body, chunk)
        if await reader.readexactly(2) != b"\r\n":
            raise TransportError("chunk not followed by CRLF")
    while True:  # trailers, up to the empty line
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            return b"".join(parts)


def _wants_keep_alive(version: str, headers: Dict[str, str]) -> bool:
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    if "close" in tokens:
        return False
    return version != "HTTP/1.0" or "keep-alive" in tokens
