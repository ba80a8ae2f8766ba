"""What run_code returns: an execution in the code interpreter of a sandbox
made from the code-interpreter template (E2B's Code Interpreter, served on
port 49999 of the sandbox), in the shapes of E2B's SDK.

The code interpreter streams an execution as JSON lines: stdout, stderr,
result, error, number_of_executions and end_of_execution. ExecutionStream
reads them as they arrive, hands each to the caller's handlers and gathers
them into an Execution.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Optional

from .errors import TransportError

# Where the code interpreter listens in a sandbox.
CODE_INTERPRETER_PORT = 49999

# The formats a Result names, by the code interpreter's keys.
_FORMATS = ("text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript")


@dataclass
class Result:
    """A value the code produced, in each format it offered (Jupyter's MIME
    bundle, with E2B's names): the value of the cell's last expression
    (is_main_result) or anything the code displayed. png, jpeg and pdf are
    base64; json is the decoded value. extra holds formats without a name
    of their own, by MIME type."""

    is_main_result: bool = False
    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    svg: Optional[str] = None
    png: Optional[str] = None
    jpeg: Optional[str] = None
    pdf: Optional[str] = None
    latex: Optional[str] = None
    json: Optional[Any] = None
    javascript: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_line(cls, line: Dict[str, Any]) -> "Result":
        known = {k: line[k] for k in _FORMATS if k in line}
        extra = {k: v for k, v in line.items() if k not in _FORMATS and k not in ("type", "is_main_result")}
        return cls(is_main_result=bool(line.get("is_main_result")), extra=extra, **known)

    def formats(self) -> List[str]:
        """The formats the result has: "text", "html", "png", ..., then
        extra's MIME types."""
        return [f for f in _FORMATS if getattr(self, f) is not None] + sorted(self.extra)


@dataclass
class ExecutionError:
    """An exception the code raised (or DeadKernelError: the context's
    process died and its state is lost)."""

    name: str
    value: str
    traceback: str

    def __str__(self) -> str:
        return f"{self.name}: {self.value}" if self.value else self.name


@dataclass
class Logs:
    """What the code printed, in the pieces it came in."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class Execution:
    """An execution: its results, output and exception. An exception in the
    code is not raised: it is error (None when the code ran through)."""

    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    # how many executions the context has run, this one included
    execution_count: Optional[int] = None

    @property
    def text(self) -> Optional[str]:
        """The text of the main result (the cell's last expression), if any."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None


Handler = Callable[[Any], Any]


class HandlerFailed(Exception):
    """A handler of the caller raised: the stream stops and the client
    raises the handler's exception itself (carried as original)."""

    def __init__(self, original: BaseException):
        super().__init__(repr(original))
        self.original = original


class ExecutionStream:
    """Reads /execute's JSON lines as they arrive (feed), calls the handlers
    and gathers the Execution (finish). Handlers may return awaitables: the
    async client awaits them, in order, before reading on."""

    def __init__(self, on_stdout: Optional[Handler] = None, on_stderr: Optional[Handler] = None,
                 on_result: Optional[Handler] = None, on_error: Optional[Handler] = None,
                 awaitable_handlers: bool = True):
        self.execution = Execution()
        self._awaitable_handlers = awaitable_handlers
        self._handlers = {"stdout": on_stdout, "stderr": on_stderr, "result": on_result, "error": on_error}
        self._buf = bytearray()
        self._scanned = 0  # no newline in _buf before this
        self.ended = False

    def feed(self, data: bytes) -> Optional[Awaitable[None]]:
        self._buf += data
        pending: List[Any] = []
        while True:
            i = self._buf.find(b"\n", self._scanned)
            if i < 0:
                self._scanned = len(self._buf)
                break
            line = bytes(self._buf[:i])
            del self._buf[:i + 1]
            self._scanned = 0
            self._line(line, pending)
        if not pending:
            return None
        return self._await_all(pending)

    async def _await_all(self, pending: List[Any]) -> None:
        for p in pending:
            try:
                await p
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except BaseException as exc:
                raise HandlerFailed(exc) from exc

    def _line(self, line: bytes, pending: List[Any]) -> None:
        if not line.strip():
            return
        try:
            ev = json.loads(line)
        except ValueError:
            ev = None
        if not isinstance(ev, dict):
            raise TransportError(f"the code interpreter sent a line that is not a JSON object: {line[:200]!r}")
        kind = ev.get("type")
        ex = self.execution
        arg: Any = None
        if kind in ("stdout", "stderr"):
            arg = str(ev.get("text", ""))
            (ex.logs.stdout if kind == "stdout" else ex.logs.stderr).append(arg)
        elif kind == "result":
            arg = Result.from_line(ev)
            ex.results.append(arg)
        elif kind == "error":
            arg = ExecutionError(str(ev.get("name", "")), str(ev.get("value", "")), str(ev.get("traceback", "")))
            ex.error = arg
        elif kind == "number_of_executions":
            ex.execution_count = ev.get("execution_count")
        elif kind == "end_of_execution":
            self.ended = True
        handler = self._handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            return
        try:
            out = handler(arg)
        except (KeyboardInterrupt, asyncio.CancelledError):
            raise
        except BaseException as exc:
            raise HandlerFailed(exc) from exc
        if inspect.isawaitable(out):
            if not self._awaitable_handlers:
                if inspect.iscoroutine(out):
                    out.close()
                raise HandlerFailed(TypeError(f"the {kind} handler returned an awaitable: the blocking "
                                              "Client's handlers are plain functions (AsyncClient awaits them)"))
            pending.append(out)

    def finish(self) -> Execution:
        """The execution, once the stream has ended; raises TransportError
        if it ended before the execution did."""
        if self._buf.strip():
            self._line(bytes(self._buf), [])
            self._buf.clear()
        if not self.ended:
            raise TransportError("the code interpreter's stream ended before the execution did "
                                 "(was the sandbox stopped?)")
        return self.execution
