"""run_code and the code contexts: both clients against a scripted local
peer (requests, streaming, errors), and against a real aenv server with a
code-interpreter sandbox (AENV_URL, AENV_API_KEY; see support.real_server).
"""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time
import unittest
import uuid

import support
import aenv
from peer import Peer, Reply
from test_client_http import AsyncFacade

TOKEN = "envd-token"

END = [{"type": "number_of_executions", "execution_count": 7}, {"type": "end_of_execution"}]


def ndjson(*events) -> bytes:
    # Python's own separators, as the kernel writes its lines.
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


class CodeInterpreterBehaviour:
    """Tests shared by both clients; subclasses provide make_client."""

    def setUp(self):
        self.peer = Peer()
        self.addCleanup(self.peer.close)
        self.peer.route("GET", "/sandboxes/sb1", lambda s: Reply.json(
            {"sandboxID": "sb1", "state": "running", "envdAccessToken": TOKEN}))

    def make_client(self, **kwargs):
        raise NotImplementedError

    def execute(self, *events, framing="chunked", status=200):
        body = ndjson(*events) if status == 200 else json.dumps(events[0]).encode()
        self.peer.route("POST", "/execute", lambda s: Reply(status, body, {"Content-Type": "application/x-ndjson"},
                                                          framing=framing))

    def test_run_code_gathers_the_execution(self):
        for framing in ("chunked", "length", "close"):
            with self.subTest(framing=framing):
                self.execute(
                    {"type": "stdout", "text": "hi\n"}, {"type": "stderr", "text": "warn"},
                    {"type": "result", "is_main_result": False, "text": "<Figure>", "png": "iVBO", "image/gif": "R0lG"},
                    {"type": "result", "is_main_result": True, "text": "42", "json": {"a": [1]}, "html": "<b>42</b>"},
                    *END, framing=framing)
                c = self.make_client()
                seen = []
                ex = c.run_code("sb1", "x + 1", context_id="ctx1", envs={"A": "b"},
                                on_stdout=lambda t: seen.append(("stdout", t)),
                                on_stderr=lambda t: seen.append(("stderr", t)),
                                on_result=lambda r: seen.append(("result", r.text)),
                                on_error=lambda e: seen.append(("error", e)))
                self.assertIsInstance(ex, aenv.Execution)
                self.assertEqual((ex.text, ex.logs.stdout, ex.logs.stderr, ex.error, ex.execution_count),
                                 ("42", ["hi\n"], ["warn"], None, 7))
                fig, main = ex.results
                self.assertEqual(fig.formats(), ["text", "png", "image/gif"])
                self.assertEqual((main.json, main.html, main.is_main_result), ({"a": [1]}, "<b>42</b>", True))
                self.assertEqual(seen, [("stdout", "hi\n"), ("stderr", "warn"), ("result", "<Figure>"), ("result", "42")])
                req = self.peer.seen[-1]
                self.assertEqual((req.method, req.path), ("POST", "/execute"))
                self.assertEqual(req.json(), {"code": "x + 1", "context_id": "ctx1", "env_vars": {"A": "b"}})
                self.assertEqual((req.headers["e2b-sandbox-id"], req.headers["e2b-sandbox-port"],
                                  req.headers["x-access-token"]), ("sb1", "49999", TOKEN))
                self.assertNotIn("x-api-key", req.headers)  # not the sandbox's to see
                # The token came from the sandbox's record.
                self.assertEqual(self.peer.seen[-2].path, "/sandboxes/sb1")

    def test_an_exception_is_the_executions(self):
        self.execute({"type": "stdout", "text": "before\n"},
                     {"type": "error", "name": "ZeroDivisionError", "value": "division by zero",
                      "traceback": "Traceback\nZeroDivisionError: division by zero"}, *END)
        errors = []
        ex = self.make_client().run_code("sb1", "1/0", access_token=TOKEN, on_error=errors.append)
        self.assertEqual((ex.error.name, ex.error.value, str(ex.error)),
                         ("ZeroDivisionError", "division by zero", "ZeroDivisionError: division by zero"))
        self.assertEqual(errors, [ex.error])
        self.assertIsNone(ex.text)
        # With the token given, the sandbox's record is not read.
        self.assertEqual(self.peer.count("GET", "/sandboxes/sb1"), 0)

    def test_errors(self):
        cases = [
            ("no code interpreter", 502, {"sandboxId": "sb1", "message": "The sandbox is running but port is not open",
                                          "port": 49999, "code": 502}, aenv.NotFound, "does not serve the code interpreter"),
            ("sandbox gone", 502, {"sandboxId": "sb1", "message": "The sandbox was not found", "code": 502},
             aenv.NotFound, "sb1 not found or not running"),
            ("wrong token", 401, {"code": 401, "message": "invalid access token"}, aenv.AuthError,
             "refused its access token (invalid access token)"),
            ("unknown context", 404, {"code": 404, "message": "Context c9 not found"}, aenv.NotFound, "Context c9 not found"),
            ("unknown language", 400, {"code": 400, "message": 'language "r" is not supported (python is)'},
             aenv.BadRequest, "not supported"),
        ]
        for name, status, body, exc, msg in cases:
            with self.subTest(name):
                self.execute(body, status=status, framing="length")
                with self.assertRaises(exc) as cm:
                    self.make_client().run_code("sb1", "1", access_token=TOKEN)
                self.assertIn(msg, str(cm.exception))
                self.assertEqual(cm.exception.status, status)

    def test_bad_input_sends_nothing(self):
        c = self.make_client()
        for kwargs in ({"code": ""}, {"code": " \n"}, {"code": "1", "context_id": "c", "language": "python"}):
            with self.subTest(**kwargs):
                with self.assertRaises(ValueError):
                    c.run_code("sb1", access_token=TOKEN, **kwargs)
        with self.assertRaises(ValueError):
            c.run_code("", "1", access_token=TOKEN)
        self.assertEqual(self.peer.seen, [])

    def test_unknown_sandbox(self):
        with self.assertRaises(aenv.NotFound):
            self.make_client().run_code("nope", "1")  # its record: the peer's 404

    def test_a_stream_cut_short(self):
        self.execute({"type": "stdout", "text": "x"})
        with self.assertRaises(aenv.TransportError) as cm:
            self.make_client().run_code("sb1", "1", access_token=TOKEN)
        self.assertIn("ended before the execution did", str(cm.exception))
        self.peer.route("POST", "/execute", lambda s: Reply(200, b"<html>\n", framing="length"))
        with self.assertRaises(aenv.TransportError):
            self.make_client().run_code("sb1", "1", access_token=TOKEN)

    def test_a_failing_handler_raises_itself(self):
        self.execute({"type": "stdout", "text": "hi\n"}, *END)

        def boom(text):
            raise LookupError("from the handler: " + text)
        c = self.make_client()
        with self.assertRaises(LookupError) as cm:
            c.run_code("sb1", "1", access_token=TOKEN, on_stdout=boom)
        self.assertEqual(str(cm.exception), "from the handler: hi\n")
        # The client is still usable.
        self.assertEqual(c.run_code("sb1", "1", access_token=TOKEN).logs.stdout, ["hi\n"])

    def test_contexts(self):
        self.peer.route("POST", "/contexts", lambda s: Reply.json({"id": "c1", "language": "python", "cwd": "/tmp"}))
        self.peer.route("GET", "/contexts", lambda s: Reply.json([{"id": "c1", "language": "python", "cwd": "/tmp"}]))
        self.peer.route("POST", "/contexts/c1/restart", lambda s: Reply(204))
        self.peer.route("DELETE", "/contexts/c1", lambda s: Reply(204))
        c = self.make_client()
        self.assertEqual(c.create_code_context("sb1", cwd="/tmp")["id"], "c1")
        self.assertEqual(self.peer.seen[-1].json(), {"cwd": "/tmp"})
        self.assertEqual([x["id"] for x in c.list_code_contexts("sb1", access_token=TOKEN)], ["c1"])
        c.restart_code_context("sb1", "c1", access_token=TOKEN)
        c.remove_code_context("sb1", "c1", access_token=TOKEN)
        with self.assertRaises(aenv.NotFound):
            c.remove_code_context("sb1", "c2", access_token=TOKEN)
        for seen in self.peer.seen[1:]:
            self.assertEqual((seen.headers["e2b-sandbox-port"], seen.headers["x-access-token"]), ("49999", TOKEN))
            self.assertNotIn("x-api-key", seen.headers)


class StreamingPeer:
    """Answers POST /execute with a first line, then waits until the test
    has seen it (release) before the rest: output must reach the caller as
    it comes, not at the end."""

    def __init__(self):
        self.release = threading.Event()
        peer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response_only(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def chunk(data: bytes):
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                chunk(ndjson({"type": "stdout", "text": "first\n"}))
                released = peer.release.wait(20)
                chunk(ndjson({"type": "stdout", "text": "second\n" if released else "never released\n"}, *END))
                self.wfile.write(b"0\r\n\r\n")

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a client that gave up (a timeout test)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class TestSyncClient(CodeInterpreterBehaviour, unittest.TestCase):
    def make_client(self, url=None, **kwargs):
        c = aenv.Client(url or self.peer.url, "k", **kwargs)
        self.addCleanup(c.close)
        return c

    def test_output_streams(self):
        peer = StreamingPeer()
        self.addCleanup(peer.close)
        ex = self.make_client(peer.url).run_code("sb1", "1", access_token=TOKEN,
                                                 on_stdout=lambda t: t == "first\n" and peer.release.set())
        self.assertEqual(ex.logs.stdout, ["first\n", "second\n"])

    def test_async_handlers_are_refused(self):
        self.execute({"type": "stdout", "text": "hi\n"}, *END)

        async def handler(text):
            pass
        with self.assertRaises(TypeError):
            self.make_client().run_code("sb1", "1", access_token=TOKEN, on_stdout=handler)


class TestAsyncClient(CodeInterpreterBehaviour, unittest.TestCase):
    def setUp(self):
        super().setUp()
        self.loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        thread.start()

        def stop():
            self.loop.call_soon_threadsafe(self.loop.stop)
            thread.join(5)
            self.loop.close()
        self.addCleanup(stop)

    def make_client(self, url=None, **kwargs):
        async def make():
            return aenv.AsyncClient(url or self.peer.url, "k", **kwargs)
        client = asyncio.run_coroutine_threadsafe(make(), self.loop).result(5)
        self.addCleanup(lambda: asyncio.run_coroutine_threadsafe(client.close(), self.loop).result(5))
        return AsyncFacade(client, self.loop)

    def test_output_streams(self):
        peer = StreamingPeer()
        self.addCleanup(peer.close)
        ex = self.make_client(peer.url).run_code("sb1", "1", access_token=TOKEN,
                                                 on_stdout=lambda t: t == "first\n" and peer.release.set())
        self.assertEqual(ex.logs.stdout, ["first\n", "second\n"])

    def test_async_handlers_are_awaited_in_order(self):
        self.execute({"type": "stdout", "text": "a"}, {"type": "stdout", "text": "b"},
                     {"type": "result", "is_main_result": True, "text": "1"}, *END)
        seen = []

        async def slow(text):
            await asyncio.sleep(0)
            seen.append(text)

        async def result(r):
            seen.append("result " + r.text)
        self.make_client().run_code("sb1", "1", access_token=TOKEN, on_stdout=slow, on_result=result)
        self.assertEqual(seen, ["a", "b", "result 1"])

    def test_a_timeout_cuts_the_run(self):
        peer = StreamingPeer()
        self.addCleanup(peer.close)
        start = time.monotonic()
        with self.assertRaises(aenv.Timeout):
            self.make_client(peer.url, timeout=0.2).run_code("sb1", "1", access_token=TOKEN, timeout=0.3)
        self.assertLess(time.monotonic() - start, 10)


# --- against a real server ---

CODE_INTERPRETER = "code-interpreter"


class TestRealCodeInterpreter(unittest.IsolatedAsyncioTestCase):
    """A code-interpreter sandbox of a real server. Its template is built on
    a server's first create of it when the template cache lacks it
    (minutes); the create waits."""

    async def asyncSetUp(self):
        url, key = support.real_server(self)
        self.client = aenv.AsyncClient(url, key, timeout=120)
        self.addAsyncCleanup(self.client.close)
        info = await self.create(CODE_INTERPRETER)
        self.sid, self.token = info["sandboxID"], info.get("envdAccessToken")

    async def create(self, template):
        # The first create on a machine may build the template: allow it
        # half an hour, trying again when a create gives up meanwhile.
        deadline = time.monotonic() + 1800
        while True:
            try:
                info = await self.client.create_sandbox_info(
                    template, timeout_s=600, metadata={"test": "aenv-python-code", "run": uuid.uuid4().hex[:12]})
                break
            except (aenv.Timeout, aenv.SandboxError) as exc:
                if isinstance(exc, aenv.SandboxError) and exc.status not in (503, 504):
                    raise
                if time.monotonic() > deadline:
                    raise
        self.addAsyncCleanup(self.delete, info["sandboxID"])
        return info

    async def delete(self, sid):
        try:
            await self.client.delete_sandbox(sid)
        except aenv.NotFound:
            pass

    async def test_state_streaming_results_and_errors(self):
        c = self.client
        await c.run_code(self.sid, "x = 41", access_token=self.token)
        printed = []
        ex = await c.run_code(self.sid, "print('adding')\nx + 1", on_stdout=printed.append)
        self.assertEqual((ex.text, ex.logs.stdout, printed, ex.error), ("42", ["adding\n"], ["adding\n"], None))

        ex = await c.run_code(self.sid, "import os\nos.environ['RUN_VAR']", envs={"RUN_VAR": "v"},
                              access_token=self.token)
        self.assertEqual(ex.text, "'v'")

        ex = await c.run_code(self.sid, "import pandas as pd\npd.DataFrame({'a': [1, 2]})", access_token=self.token)
        self.assertIn("<table", ex.results[0].html)

        errors = []
        ex = await c.run_code(self.sid, "1/0", on_error=errors.append, access_token=self.token)
        self.assertEqual((ex.error.name, ex.error.value), ("ZeroDivisionError", "division by zero"))
        self.assertIn("1/0", ex.error.traceback)
        self.assertEqual(errors, [ex.error])

        with self.assertRaises(aenv.AuthError):
            await c.run_code(self.sid, "1", access_token="wrong")

    async def test_contexts(self):
        c = self.client
        ctx = await c.create_code_context(self.sid, cwd="/tmp", access_token=self.token)
        ex = await c.run_code(self.sid, "import os\nos.getcwd()", context_id=ctx["id"], access_token=self.token)
        self.assertEqual(ex.text, "'/tmp'")
        self.assertIn(ctx["id"], [x["id"] for x in await c.list_code_contexts(self.sid)])
        await c.run_code(self.sid, "kept = 1", context_id=ctx["id"], access_token=self.token)
        await c.restart_code_context(self.sid, ctx["id"], access_token=self.token)
        ex = await c.run_code(self.sid, "kept", context_id=ctx["id"], access_token=self.token)
        self.assertEqual(ex.error.name, "NameError")
        await c.remove_code_context(self.sid, ctx["id"], access_token=self.token)
        with self.assertRaises(aenv.NotFound):
            await c.run_code(self.sid, "1", context_id=ctx["id"], access_token=self.token)

    async def test_the_env_runs_code(self):
        env = aenv.SandboxEnv(self.client, CODE_INTERPRETER)
        self.addAsyncCleanup(env.close)
        with self.assertRaises(RuntimeError):
            await env.run_code("1")
        await env.reset()
        await env.run_code("y = 2")
        ex = await env.run_code("y * 21")
        self.assertEqual((ex.text, ex.execution_count), ("42", 2))

    async def test_a_sandbox_without_one(self):
        base = await self.create("base")
        with self.assertRaises(aenv.NotFound) as cm:
            await self.client.run_code(base["sandboxID"], "1")
        self.assertIn("does not serve the code interpreter", str(cm.exception))

    def test_the_blocking_client(self):
        url, key = support.real_server(self)
        with aenv.Client(url, key, timeout=120) as c:
            ex = c.run_code(self.sid, "sum(range(10))")
            self.assertEqual(ex.text, "45")


if __name__ == "__main__":
    unittest.main()
