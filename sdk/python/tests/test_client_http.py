"""The clients' HTTP machinery against a scripted local peer.

Every behaviour is checked on both clients: the sync Client directly and
the AsyncClient through a facade that runs its coroutines on one event
loop in a background thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import unittest
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import support  # noqa: F401  (puts src/ on sys.path)
import aenv
from peer import RESET, Peer, Reply, sequence

FAST_RETRY = aenv.RetryPolicy(max_attempts=4, backoff_base=0.01, backoff_max=0.02)


class AsyncFacade:
    """Calls an AsyncClient's methods as if they were blocking."""

    def __init__(self, client: aenv.AsyncClient, loop: asyncio.AbstractEventLoop):
        self._client = client
        self._loop = loop

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            return asyncio.run_coroutine_threadsafe(attr(*args, **kwargs), self._loop).result(30)
        return call


class ClientBehaviour:
    """Tests shared by both clients; subclasses provide make_client."""

    def setUp(self):
        self.peer = Peer()
        self.addCleanup(self.peer.close)

    def make_client(self, **kwargs):
        raise NotImplementedError

    def test_create_sends_the_seed_body_and_api_key(self):
        self.peer.route("POST", "/sandboxes", lambda s: Reply.json(
            {"sandboxID": "sb1", "templateID": "base", "envdVersion": "0.6.4"}, 201))
        c = self.make_client()
        net = aenv.Network(allow_internet=False, denied_cidrs=["10.0.0.0/8"], allowed_cidrs=["1.1.1.1/32"])
        got = c.create_sandbox("base", vcpu=2, memory_mb=512, timeout_s=30, auto_pause=True,
                               metadata={"run": "r1"}, env_vars={"A": "1"}, network=net)
        self.assertEqual(got, "sb1")
        seen = self.peer.seen[0]
        self.assertEqual(seen.headers["x-api-key"], "k")
        self.assertEqual(seen.headers["content-type"], "application/json")
        self.assertEqual(seen.json(), {
            "templateID": "base", "vcpu": 2, "memoryMB": 512, "timeout": 30, "autoPause": True,
            "metadata": {"run": "r1"}, "envVars": {"A": "1"}, "allowInternetAccess": False,
            "alwaysDeniedCIDRs": ["10.0.0.0/8"], "alwaysAllowedCIDRs": ["1.1.1.1/32"]})

    def test_domains_and_the_egress_log(self):
        self.peer.route("POST", "/sandboxes", lambda s: Reply.json({"sandboxID": "sb1"}, 201))
        self.peer.route("GET", "/sandboxes/sb1/egress", lambda s: Reply.json([{"host": "pypi.org", "verdict": "allowed"}]))
        c = self.make_client()
        net = aenv.Network(allow_internet=False, allowed_domains=["pypi.org", "*.github.com"])
        c.create_sandbox("base", network=net)
        self.assertEqual(self.peer.seen[0].json()["alwaysAllowedDomains"], ["pypi.org", "*.github.com"])
        self.assertEqual(c.egress_log("sb1"), [{"host": "pypi.org", "verdict": "allowed"}])
        self.peer.route("PUT", "/sandboxes/sb1/network", lambda s: Reply(204, b""))
        proxy = {"address": "proxy.example:1080", "username": "u", "password": "p"}
        c.update_network("sb1", aenv.Network(allow_internet=False, allowed_cidrs=["1.1.1.1"],
                                             allowed_domains=["pypi.org"], egress_proxy=proxy))
        self.assertEqual(self.peer.seen[-1].json(), {"allowInternetAccess": False, "allowOut": ["1.1.1.1/32", "pypi.org"],
                                                     "denyOut": [], "egressProxy": proxy})
        c.create_sandbox("base", network=aenv.Network(egress_proxy=proxy))
        self.assertEqual(self.peer.seen[-1].json()["network"], {"egressProxy": proxy})
        rules = {"api.test": {"Authorization": "Bearer ${e2b.secrets.key}"}}
        c.create_sandbox("base", network=aenv.Network(header_rules=rules))
        self.assertEqual(self.peer.seen[-1].json()["network"], {"rules": {"api.test": [
            {"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.key}"}}}]}})
        c.update_network("sb1", aenv.Network(header_rules=rules))
        self.assertEqual(self.peer.seen[-1].json()["rules"]["api.test"][0]["transform"]["headers"],
                         {"Authorization": "Bearer ${e2b.secrets.key}"})

    def test_volumes_mounts_copies_and_the_content_token(self):
        self.peer.route("POST", "/sandboxes", lambda s: Reply.json({"sandboxID": "sb1"}, 201))
        self.peer.route("POST", "/sandboxes/sb1/fork", lambda s: Reply.json([{"sandbox": {"sandboxID": "c1"}}], 201))
        self.peer.route("POST", "/volumes", lambda s: Reply.json({"volumeID": "vol-1", "name": "data", "token": "vtok_x"}, 201))
        self.peer.route("GET", "/volumecontent/vol-1/file", lambda s: Reply(200, b"hello"))
        c = self.make_client()
        vol = c.create_volume("data")
        self.assertEqual(vol, aenv.Volume("vol-1", "data", "vtok_x"))
        c.create_sandbox("base", volume_mounts={"/a": vol, "/b": "other", "/c": {"name": "ro", "read_only": True}})
        self.assertEqual(self.peer.seen[1].json()["volumeMounts"], [
            {"name": "vol-1", "path": "/a"}, {"name": "other", "path": "/b"}, {"name": "ro", "path": "/c", "readOnly": True}])
        self.assertEqual(list(c.fork_sandbox("sb1", 1, copy_volumes=["/a"])), ["c1"])
        self.assertEqual(self.peer.seen[2].json(), {"count": 1, "volumes": {"/a": "copy"}})
        self.assertEqual(c.read_volume_file(vol, "/f.txt"), "hello")
        seen = self.peer.seen[3]
        self.assertEqual(seen.headers["authorization"], "Bearer vtok_x")
        self.assertNotIn("x-api-key", seen.headers)
        self.peer.route("POST", "/volumes", lambda s: Reply.json(
            {"volumeID": "vol-2", "name": "big", "token": "vtok_y", "sizeMB": 2048}, 201))
        self.assertEqual(c.create_volume("big", size_mb=2048), aenv.Volume("vol-2", "big", "vtok_y", 2048))
        self.assertEqual(self.peer.seen[-1].json(), {"name": "big", "sizeMB": 2048})

    def test_error_mapping(self):
        cases = [
            (400, {"code": 400, "message": "bad vcpu"}, aenv.BadRequest, "bad vcpu"),
            (401, {"code": 401, "message": "missing key"}, aenv.AuthError, "missing key"),
            (403, {"code": 403, "message": "forbidden"}, aenv.AuthError, "forbidden"),
            (404, {"code": 404, "message": "no sandbox"}, aenv.NotFound, "no sandbox"),
            (409, {"code": 409, "message": "already paused"}, aenv.Conflict, "already paused"),
            (500, {"code": 500, "message": "internal error"}, aenv.SandboxError, "internal error"),
            (502, None, aenv.SandboxError, "<html>bad gateway</html>"),
        ]
        c = self.make_client(retry=aenv.RetryPolicy(max_attempts=1))
        for status, body, cls, message in cases:
            with self.subTest(status=status):
                raw = json.dumps(body).encode() if body else message.encode()
                self.peer.route("GET", "/sandboxes/x", lambda s, st=status, b=raw: Reply(st, b))
                with self.assertRaises(cls) as caught:
                    c.get_sandbox("x")
                self.assertIsInstance(caught.exception, aenv.AenvError)
                self.assertEqual(caught.exception.status, status)
                self.assertEqual(caught.exception.message, message)

    def test_response_framings(self):
        body = {"exitCode": 0, "stdout": "x" * 1000, "stderr": ""}
        c = self.make_client()
        for framing in ("length", "chunked", "close"):
            with self.subTest(framing=framing):
                self.peer.route("POST", "/sandboxes/s/execute",
                                lambda s, f=framing: Reply.json(body, framing=f))
                self.assertEqual(c.exec_command("s", "true"), body)
                self.assertEqual(c.exec_command("s", "true"), body)

    def test_keep_alive_reuses_one_connection(self):
        self.peer.route("GET", "/sandboxes/s", lambda s: Reply.json({"sandboxID": "s"}))
        self.peer.route("DELETE", "/sandboxes/s", lambda s: Reply(204))
        c = self.make_client()
        for _ in range(10):
            c.get_sandbox("s")
            c.delete_sandbox("s")
        self.assertEqual(c.connections_opened, 1)
        self.assertEqual(len(self.peer.ports()), 1)

    def test_server_closed_idle_connection_is_not_reused(self):
        self.peer.route("POST", "/sandboxes/s/execute",
                        lambda s: Reply.json({"exitCode": 0, "stdout": "", "stderr": ""}, close_after=True))
        c = self.make_client()
        for _ in range(3):
            c.exec_command("s", "true")
            time.sleep(0.05)  # the FIN arrives while the connection is idle
        self.assertEqual(self.peer.count("POST", "/sandboxes/s/execute"), 3)
        self.assertEqual(c.connections_opened, 3)

    def test_idempotent_calls_retry_429_and_503(self):
        busy = Reply.json({"code": 503, "message": "busy"}, 503)
        limited = Reply.json({"code": 429, "message": "slow down"}, 429, headers={"Retry-After": "0"})
        self.peer.route("GET", "/sandboxes/s", sequence(busy, limited, Reply.json({"sandboxID": "s"})))
        c = self.make_client()
        self.assertEqual(c.get_sandbox("s"), {"sandboxID": "s"})
        self.assertEqual(self.peer.count("GET", "/sandboxes/s"), 3)

    def test_retries_give_up_after_max_attempts(self):
        self.peer.route("GET", "/sandboxes/s", lambda s: Reply.json({"code": 503, "message": "busy"}, 503))
        c = self.make_client()
        with self.assertRaises(aenv.SandboxError) as caught:
            c.get_sandbox("s")
        self.assertEqual(caught.exception.status, 503)
        self.assertEqual(self.peer.count("GET", "/sandboxes/s"), 4)

    def test_non_idempotent_calls_are_never_retried(self):
        busy = Reply.json({"code": 503, "message": "busy"}, 503)
        calls = [
            ("POST", "/sandboxes", lambda c: c.create_sandbox("base")),
            ("POST", "/sandboxes/s/execute", lambda c: c.exec_command("s", "true")),
            ("POST", "/sandboxes/s/fork", lambda c: c.fork_sandbox("s", 2)),
            ("POST", "/sandboxes/s/pause", lambda c: c.pause_sandbox("s")),
            ("POST", "/sandboxes/s/snapshots", lambda c: c.create_snapshot("s")),
            ("POST", "/templates", lambda c: c.create_template("s", "t")),
        ]
        c = self.make_client()
        for method, path, do in calls:
            for failure in (busy, RESET):
                with self.subTest(path=path, failure="reset" if failure is RESET else 503):
                    before = self.peer.count(method, path)
                    self.peer.route(method, path, lambda s, f=failure: f)
                    with self.assertRaises((aenv.SandboxError, aenv.TransportError)):
                        do(c)
                    self.assertEqual(self.peer.count(method, path) - before, 1)

    def test_connection_reset_is_retried_for_idempotent_calls(self):
        ok = Reply.json({"content": "hi"})
        self.peer.route("GET", "/sandboxes/s/files/read", sequence(RESET, RESET, ok))
        c = self.make_client()
        self.assertEqual(c.read_file("s", "/a"), "hi")
        self.assertEqual(self.peer.count("GET", "/sandboxes/s/files/read"), 3)

    def test_delete_answered_404_after_a_lost_answer_succeeds(self):
        gone = Reply.json({"code": 404, "message": "not found"}, 404)
        self.peer.route("DELETE", "/sandboxes/s", sequence(RESET, gone))
        c = self.make_client()
        c.delete_sandbox("s")  # the first attempt may have deleted it
        self.peer.route("DELETE", "/sandboxes/t", lambda s: gone)
        with self.assertRaises(aenv.NotFound):
            c.delete_sandbox("t")  # a plain 404 is still an error

    def test_timeout_raises_and_is_not_retried(self):
        self.peer.route("GET", "/sandboxes/s", lambda s: Reply.json({}, delay=1.0))
        c = self.make_client(timeout=0.2)
        start = time.monotonic()
        with self.assertRaises(aenv.Timeout) as caught:
            c.get_sandbox("s")
        self.assertIsInstance(caught.exception, TimeoutError)
        self.assertLess(time.monotonic() - start, 0.9)
        self.assertEqual(self.peer.count("GET", "/sandboxes/s"), 1)

    def test_execute_waits_for_the_command_timeout(self):
        # An execute may take its command timeout on top of the client timeout.
        self.peer.route("POST", "/sandboxes/s/execute",
                        lambda s: Reply.json({"exitCode": 0, "stdout": "", "stderr": ""}, delay=0.5))
        c = self.make_client(timeout=0.2)
        self.assertEqual(c.exec_command("s", "sleep 0.5", timeout=2)["exitCode"], 0)
        self.assertEqual(self.peer.seen[-1].json(), {"command": "sleep 0.5", "timeout": 2})

    def test_connection_refused_is_a_transport_error(self):
        port = self.peer.server.server_address[1]
        self.peer.close()
        c = self.make_client(url=f"http://127.0.0.1:{port}")
        with self.assertRaises(aenv.TransportError):
            c.get_sandbox("s")

    def test_files_text_and_bytes(self):
        store = {}

        def put(s):
            store[s.query["path"]] = s.body
            return Reply.json({"path": s.query["path"], "size": len(s.body)})

        def write(s):
            store[s.json()["path"]] = s.json()["content"].encode()
            return Reply.json({})

        self.peer.route("PUT", "/sandboxes/s/files", put)
        self.peer.route("GET", "/sandboxes/s/files",
                        lambda s: Reply(200, store[s.query["path"]], {"Content-Type": "application/octet-stream"}))
        self.peer.route("POST", "/sandboxes/s/files/write", write)
        self.peer.route("GET", "/sandboxes/s/files/read",
                        lambda s: Reply.json({"content": store[s.query["path"]].decode()}))
        c = self.make_client()
        blob = bytes(range(256)) * 100
        c.write_file("s", "/bin.dat", blob)
        self.assertEqual(c.read_file("s", "/bin.dat", binary=True), blob)
        c.write_file("s", "/t.txt", "héllo\n")
        self.assertEqual(c.read_file("s", "/t.txt"), "héllo\n")
        with self.assertRaises(TypeError):
            c.write_file("s", "/x", 42)

    def test_list_follows_pages_and_encodes_metadata_like_e2b(self):
        pages = {None: ([{"sandboxID": "a"}, {"sandboxID": "b"}], "t1"), "t1": ([{"sandboxID": "c"}], None)}

        def listing(s):
            # Decode as the Go server does: query, then the whole, then each part.
            whole = urllib.parse.unquote(s.query["metadata"])
            md = {}
            for pair in whole.split("&"):
                key, value = pair.split("=", 1)
                md[urllib.parse.unquote(key)] = urllib.parse.unquote(value)
            self.assertEqual(md, {"run id": "a&b=c", "k": "v"})
            self.assertEqual(s.query["state"], "running,paused")
            items, token = pages[s.query.get("nextToken")]
            return Reply.json(items, headers={"X-Next-Token": token} if token else {})

        self.peer.route("GET", "/sandboxes", listing)
        c = self.make_client()
        got = c.list_sandboxes(state=["running", "paused"], metadata={"run id": "a&b=c", "k": "v"})
        self.assertEqual([s["sandboxID"] for s in got], ["a", "b", "c"])

    def test_fork_results(self):
        e2b_shape = [
            {"sandbox": {"sandboxID": "c1"}},
            {"error": {"code": 507, "message": "disk full"}},
            {"sandbox": {"sandboxID": "c2"}},
        ]
        self.peer.route("POST", "/sandboxes/s/fork", lambda s: Reply.json(e2b_shape, 201))
        c = self.make_client()
        got = c.fork_sandbox("s", count=3, timeout_s=60)
        self.assertEqual(list(got), ["c1", "c2"])
        self.assertEqual([(e.status, e.message) for e in got.errors], [(507, "disk full")])
        self.assertEqual(self.peer.seen[-1].json(), {"count": 3, "timeout": 60})

        self.peer.route("POST", "/sandboxes/s/fork", lambda s: Reply.json({"childSandboxIDs": ["x", "y"]}, 201))
        self.assertEqual(list(c.fork_sandbox("s", 2)), ["x", "y"])

        all_failed = [{"error": {"code": 409, "message": "paused"}}] * 2
        self.peer.route("POST", "/sandboxes/s/fork", lambda s: Reply.json(all_failed, 201))
        with self.assertRaises(aenv.Conflict):
            c.fork_sandbox("s", 2)

    def test_lifecycle_calls(self):
        self.peer.route("POST", "/sandboxes/s/pause", lambda s: Reply(204))
        self.peer.route("POST", "/v2/sandboxes/s/connect", lambda s: Reply.json({"sandboxID": "s"}, 201))
        self.peer.route("POST", "/sandboxes/s/timeout", lambda s: Reply(204))
        self.peer.route("POST", "/sandboxes/s/snapshots",
                        lambda s: Reply.json({"snapshotID": "snap1", "names": ["n"]}, 201))
        self.peer.route("POST", "/templates", lambda s: Reply.json({"templateID": "tpl1"}, 201))
        self.peer.route("GET", "/snapshots", lambda s: Reply.json([{"snapshotID": "snap1", "names": ["n"]}]))
        self.peer.route("DELETE", "/templates/snap1", lambda s: Reply(204))
        c = self.make_client()
        c.pause_sandbox("s")
        c.resume_sandbox("s")
        c.set_timeout("s", 90)
        self.assertEqual(self.peer.seen[-1].json(), {"timeout": 90})
        self.assertEqual(c.create_snapshot("s", name="n"), "snap1")
        self.assertEqual(self.peer.seen[-1].json(), {"name": "n"})
        self.assertEqual(c.create_template("s", "t"), "tpl1")
        self.assertEqual(self.peer.seen[-1].json(), {"sandboxID": "s", "name": "t"})
        self.assertEqual(c.list_snapshots(sandbox_id="s")[0]["snapshotID"], "snap1")
        self.assertEqual(self.peer.seen[-1].query, {"sandboxID": "s", "limit": "100"})
        c.delete_snapshot("snap1")

    def test_ids_are_path_escaped(self):
        self.peer.route("GET", "/sandboxes/a/b", lambda s: Reply.json({"wrong": True}))
        self.peer.route("GET", "/sandboxes/a%2Fb", lambda s: Reply.json({"ok": True}))
        c = self.make_client()
        self.assertEqual(c.get_sandbox("a/b"), {"ok": True})

    def test_calls_after_close_raise(self):
        c = self.make_client()
        c.close()
        with self.assertRaises(aenv.ClientClosed):
            c.get_sandbox("s")


class TestSyncClient(ClientBehaviour, unittest.TestCase):
    def make_client(self, url=None, **kwargs):
        kwargs.setdefault("retry", FAST_RETRY)
        c = aenv.Client(url or self.peer.url, "k", **kwargs)
        self.addCleanup(c.close)
        return c

    def test_threads_share_a_bounded_pool(self):
        self.peer.route("GET", "/sandboxes/s", lambda s: Reply.json({"sandboxID": "s"}, delay=0.01))
        c = self.make_client(max_connections=8)
        with ThreadPoolExecutor(32) as pool:
            results = list(pool.map(lambda _: c.get_sandbox("s"), range(200)))
        self.assertEqual(len(results), 200)
        self.assertLessEqual(c.connections_opened, 8)
        self.assertLessEqual(self.peer.max_in_flight, 8)


class TestAsyncClient(ClientBehaviour, unittest.TestCase):
    def setUp(self):
        super().setUp()
        self.loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        thread.start()

        def stop():
            self.loop.call_soon_threadsafe(self.loop.stop)
            thread.join()
            self.loop.close()
        self.addCleanup(stop)

    def make_client(self, url=None, **kwargs):
        kwargs.setdefault("retry", FAST_RETRY)

        async def build():
            return aenv.AsyncClient(url or self.peer.url, "k", **kwargs)
        c = asyncio.run_coroutine_threadsafe(build(), self.loop).result()
        facade = AsyncFacade(c, self.loop)
        self.addCleanup(facade.close)
        return facade

    def test_hundreds_of_concurrent_calls_from_one_loop(self):
        self.peer.route("POST", "/sandboxes/s/execute",
                        lambda s: Reply.json({"exitCode": 0, "stdout": s.json()["command"], "stderr": ""},
                                             delay=0.02, framing="chunked"))

        async def run():
            async with aenv.AsyncClient(self.peer.url, "k", max_connections=16) as c:
                results = await asyncio.gather(*[c.exec_command("s", f"echo {i}") for i in range(300)])
                return results, c.connections_opened

        results, opened = asyncio.run_coroutine_threadsafe(run(), self.loop).result(60)
        self.assertEqual([r["stdout"] for r in results], [f"echo {i}" for i in range(300)])
        self.assertLessEqual(opened, 16)
        self.assertLessEqual(len(self.peer.ports()), 16)
        self.assertLessEqual(self.peer.max_in_flight, 16)

    def test_cancelled_call_does_not_poison_the_pool(self):
        self.peer.route("GET", "/sandboxes/slow", lambda s: Reply.json({}, delay=0.5))
        self.peer.route("GET", "/sandboxes/s", lambda s: Reply.json({"sandboxID": "s"}))

        async def run():
            async with aenv.AsyncClient(self.peer.url, "k", max_connections=1) as c:
                task = asyncio.ensure_future(c.get_sandbox("slow"))
                await asyncio.sleep(0.1)
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                return await c.get_sandbox("s")

        got = asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)
        self.assertEqual(got, {"sandboxID": "s"})


if __name__ == "__main__":
    unittest.main()
