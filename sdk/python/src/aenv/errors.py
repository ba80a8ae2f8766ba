"""Exceptions raised by the aenv clients.

Every exception derives from AenvError. Errors the server answered with
(a status and a JSON {"code", "message"} body) are SandboxError or one of
its subclasses; failures to talk to the server at all are TransportError.
"""

from __future__ import annotations

import json


class AenvError(Exception):
    """Base class of every error raised by this package."""


class SandboxError(AenvError):
    """The server answered with an error status.

    status is the HTTP status; message is the server's explanation.
    """

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class BadRequest(SandboxError):
    """400: the request was malformed or a value was out of range."""


class AuthError(SandboxError):
    """401 or 403: the API key is missing or wrong."""


class NotFound(SandboxError):
    """404: no such sandbox, snapshot, template or file (or endpoint)."""


class Conflict(SandboxError):
    """409: the sandbox is in the wrong state for the operation."""


class TransportError(AenvError):
    """The request did not get an HTTP answer: refused, reset, or cut short."""


class Timeout(TransportError, TimeoutError):
    """The request took longer than its timeout."""


class ClientClosed(AenvError):
    """The client was closed before or during the call."""


_BY_STATUS = {400: BadRequest, 401: AuthError, 403: AuthError, 404: NotFound, 409: Conflict}


def error_from_response(status: int, body: bytes) -> SandboxError:
    """Builds the exception for an error response.

    The server sends {"code", "message"}; anything else (a proxy's HTML
    page, Go's plain-text 404 for an unknown route) becomes the message.
    """
    message = ""
    try:
        decoded = json.loads(body)
        if isinstance(decoded, dict) and isinstance(decoded.get("message"), str):
            message = decoded["message"]
    except ValueError:
        pass
    if not message:
        message = body[:500].decode("utf-8", "replace").strip() or f"HTTP {status}"
    return _BY_STATUS.get(status, SandboxError)(status, message)


def is_infra_error(exc: BaseException) -> bool:
    """Whether exc is an infrastructure failure rather than a caller mistake.

    RL trainers use this to mask a trajectory out of group statistics: the
    sandbox died or vanished (404 during a rollout), the server was
    unreachable, overloaded (429) or failed (5xx other than 501, which
    means "this server cannot do that"). A 400, 401 or 409 is a bug in the
    caller and is not masked.
    """
    if isinstance(exc, TransportError):
        return True
    if isinstance(exc, SandboxError):
        return exc.status in (404, 429) or (exc.status >= 500 and exc.status != 501)
    return False
