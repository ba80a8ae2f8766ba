"""A scripted HTTP/1.1 server on 127.0.0.1 for testing the clients' own
machinery: framing, keep-alive, retries, timeouts, error mapping.

Each test installs handlers: handler(req) -> Reply | None, where req is a
Seen record; returning RESET drops the connection with a TCP reset.
"""

from __future__ import annotations

import http.server
import json
import socket
import struct
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple


@dataclass
class Seen:
    method: str
    path: str
    query: Dict[str, str]
    headers: Dict[str, str]
    body: bytes
    client_port: int

    def json(self):
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: Dict[str, str] = field(default_factory=dict)
    framing: str = "length"  # "length", "chunked" or "close" (read until EOF)
    close_after: bool = False  # close the connection after replying, silently
    delay: float = 0.0

    @classmethod
    def json(cls, value, status: int = 200, **kwargs) -> "Reply":
        headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
        return cls(status, json.dumps(value).encode(), headers, **kwargs)


RESET = object()
Handler = Callable[[Seen], object]


class Peer:
    def __init__(self):
        self.routes: Dict[Tuple[str, str], Handler] = {}
        self.seen: List[Seen] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        peer = self

        class RequestHandler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _serve(self):
                peer._serve(self)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # resets and closes are on purpose

        self.server = Server(("127.0.0.1", 0), RequestHandler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def route(self, method: str, path: str, handler: Handler):
        self.routes[(method, path)] = handler

    def count(self, method: str, path: str) -> int:
        with self.lock:
            return sum(1 for s in self.seen if s.method == method and s.path == path)

    def ports(self) -> set:
        with self.lock:
            return {s.client_port for s in self.seen}

    def _serve(self, h: http.server.BaseHTTPRequestHandler):
        url = urllib.parse.urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        seen = Seen(h.command, url.path, dict(urllib.parse.parse_qsl(url.query)),
                    {k.lower(): v for k, v in h.headers.items()}, body, h.client_address[1])
        with self.lock:
            self.seen.append(seen)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            handler = self.routes.get((h.command, url.path))
            reply = handler(seen) if handler else Reply.json({"code": 404, "message": "no route"}, 404)
            if reply is RESET:
                h.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                h.request.close()
                h.close_connection = True
                return
            _send(h, reply)
        finally:
            with self.lock:
                self.in_flight -= 1


def _send(h: http.server.BaseHTTPRequestHandler, reply: Reply):
    if reply.delay:
        time.sleep(reply.delay)
    h.send_response_only(reply.status)
    for name, value in reply.headers.items():
        h.send_header(name, value)
    if reply.framing == "chunked":
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        data = reply.body
        for i in range(0, len(data), 7):  # small odd chunks, with an extension on one
            chunk = data[i:i + 7]
            ext = ";x=y" if i == 0 else ""
            h.wfile.write(f"{len(chunk):x}{ext}\r\n".encode() + chunk + b"\r\n")
        h.wfile.write(b"0\r\nX-Trailer: t\r\n\r\n")
    elif reply.framing == "close":
        h.end_headers()
        h.wfile.write(reply.body)
        h.close_connection = True
    else:
        if reply.status not in (204, 304):
            h.send_header("Content-Length", str(len(reply.body)))
        h.end_headers()
        h.wfile.write(reply.body)
    h.wfile.flush()
    if reply.close_after:
        h.close_connection = True


def sequence(*replies) -> Handler:
    """A handler answering with each reply in turn, then the last forever."""
    lock = threading.Lock()
    state = {"i": 0}

    def handler(seen: Seen):
        with lock:
            i = min(state["i"], len(replies) - 1)
            state["i"] += 1
        r = replies[i]
        return r(seen) if callable(r) else r

    return handler
