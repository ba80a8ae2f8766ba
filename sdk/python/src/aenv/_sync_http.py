"""The blocking HTTP layer: http.client connections in a thread-safe pool."""

from __future__ import annotations

import http.client
import select
import threading
import time
from typing import List, Optional, Tuple

from ._wire import Endpoint, Request, Response
from .errors import ClientClosed, Timeout, TransportError


_STREAM_PIECE = 64 * 1024


class _StaleConnection(TransportError):
    """A reused connection was closed by the server before it answered."""


class SyncConnectionPool:
    """Sends requests to one endpoint over pooled keep-alive connections.

    Safe to share between threads: at most max_connections requests are
    in flight, the rest wait. The sync timeout bounds connect and each
    socket read, not the request as a whole (http.client cannot).
    """

    def __init__(self, endpoint: Endpoint, max_connections: int = 100,
                 connect_timeout: float = 10.0, idle_timeout: float = 20.0):
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self._endpoint = endpoint
        self._connect_timeout = connect_timeout
        self._idle_timeout = idle_timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._idle: List[Tuple[http.client.HTTPConnection, float]] = []
        self._closed = False
        self.connections_opened = 0

    def send(self, req: Request) -> Response:
        if self._closed:
            raise ClientClosed("client is closed")
        with self._slots:
            try:
                return self._send_in_slot(req)
            except _StaleConnection as exc:
                if not req.idempotent:
                    raise TransportError(f"{req.method} {req.target}: connection closed by server before a response") from exc
                return self._send_in_slot(req, fresh=True)

    def _send_in_slot(self, req: Request, fresh: bool = False) -> Response:
        conn = None if fresh else self._take_idle()
        reused = conn is not None
        if conn is None:
            conn = self._new_connection()
        conn.timeout = req.timeout
        if conn.sock is not None:
            conn.sock.settimeout(req.timeout)
        try:
            resp, keep_alive = self._exchange(conn, req)
        except TimeoutError as exc:
            conn.close()
            raise Timeout(f"{req.method} {req.target}: no response within {req.timeout} s") from exc
        except (ConnectionResetError, BrokenPipeError) as exc:
            # RemoteDisconnected is a ConnectionResetError too.
            conn.close()
            if reused:
                raise _StaleConnection(str(exc)) from exc
            raise TransportError(f"{req.method} {req.target}: {exc!r}") from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise TransportError(f"{req.method} {req.target}: {exc!r}") from exc
        except BaseException:
            conn.close()
            raise
        self._release(conn, keep_alive)
        return resp

    def _exchange(self, conn: http.client.HTTPConnection, req: Request) -> Tuple[Response, bool]:
        if conn.sock is None:
            self._connect(conn)
            conn.sock.settimeout(req.timeout)
        body = req.body if (req.body or req.method in ("POST", "PUT", "PATCH")) else None
        conn.request(req.method, self._endpoint.prefix + req.target, body=body, headers=req.headers)
        raw = conn.getresponse()
        if req.on_body is not None and 200 <= raw.status < 300:
            # A stream: each piece as it arrives (read1 returns what one
            # read gives, chunked framing undone).
            while True:
                piece = raw.read1(_STREAM_PIECE)
                if not piece:
                    break
                req.on_body(piece)
            data = b""
        else:
            data = raw.read()
        headers = {}
        for name, value in raw.getheaders():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        return Response(raw.status, headers, data), not raw.will_close

    def _connect(self, conn: http.client.HTTPConnection) -> None:
        conn.timeout = self._connect_timeout
        try:
            conn.connect()
        except TimeoutError as exc:
            raise Timeout(f"connect to {conn.host}:{conn.port}: no answer within {self._connect_timeout} s") from exc
        except OSError as exc:
            raise TransportError(f"connect to {conn.host}:{conn.port}: {exc}") from exc
        with self._lock:
            self.connections_opened += 1

    def _new_connection(self) -> http.client.HTTPConnection:
        ep = self._endpoint
        if ep.scheme == "https":
            return http.client.HTTPSConnection(ep.host, ep.port, context=ep.ssl_context())
        return http.client.HTTPConnection(ep.host, ep.port)

    def _take_idle(self) -> Optional[http.client.HTTPConnection]:
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn, since = self._idle.pop()
            if now - since < self._idle_timeout and _still_open(conn):
                return conn
            conn.close()

    def _release(self, conn: http.client.HTTPConnection, keep_alive: bool) -> None:
        with self._lock:
            if keep_alive and not self._closed:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """An idle connection is readable only if the server closed it (or
    sent garbage): either way it must not be reused."""
    if conn.sock is None:
        return False
    try:
        readable, _, _ = select.select([conn.sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable
