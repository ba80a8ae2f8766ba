"""Both clients and SandboxEnv against a real aenv server (AENV_URL,
AENV_API_KEY; see support.real_server). Every sandbox a test creates is
deleted in a cleanup, also when the test fails."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import unittest
import uuid

import support
import aenv

TEMPLATE = os.environ.get("AENV_TEMPLATE", "base")
EXAMPLE = os.path.join(os.path.dirname(support.SRC), "..", "..", "examples", "grpo_rollouts.py")


class AsyncServerTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.url, self.key = support.real_server(self)
        self.client = aenv.AsyncClient(self.url, self.key, timeout=120)
        self.run_id = uuid.uuid4().hex[:12]
        self.created = []
        # Cleanups run last-in first-out: sandboxes go before the client.
        self.addAsyncCleanup(self.client.close)
        self.addAsyncCleanup(self.delete_created)

    async def delete_created(self):
        for sandbox_id in self.created:
            try:
                await self.client.delete_sandbox(sandbox_id)
            except aenv.NotFound:
                pass

    async def new_sandbox(self, **kwargs) -> str:
        kwargs.setdefault("timeout_s", 300)
        kwargs.setdefault("metadata", {"test": "aenv-python", "run": self.run_id})
        sandbox_id = await self.client.create_sandbox(TEMPLATE, **kwargs)
        self.created.append(sandbox_id)
        return sandbox_id


class TestAsyncClient(AsyncServerTest):
    async def test_create_exec_get_delete(self):
        sid = await self.new_sandbox(vcpu=1, memory_mb=512, env_vars={"GREETING": "hello"})
        info = await self.client.get_sandbox(sid)
        self.assertEqual((info["sandboxID"], info["state"], info["cpuCount"], info["memoryMB"]),
                         (sid, "running", 1, 512))
        self.assertEqual(info["metadata"]["run"], self.run_id)

        res = await self.client.exec_command(sid, "echo $GREETING; echo oops >&2; exit 3")
        self.assertEqual((res["exitCode"], res["stdout"], res["stderr"]), (3, "hello\n", "oops\n"))
        res = await self.client.exec_command(sid, "pwd; echo $X; id -un", cwd="/tmp", envs={"X": "y"})
        self.assertEqual(res["stdout"].split(), ["/tmp", "y", "user"])  # E2B's default user
        res = await self.client.exec_command(sid, "id -un", user="root")
        self.assertEqual(res["stdout"], "root\n")

        await self.client.delete_sandbox(sid)
        with self.assertRaises(aenv.NotFound):
            await self.client.get_sandbox(sid)
        with self.assertRaises(aenv.NotFound):
            await self.client.delete_sandbox(sid)
        with self.assertRaises(aenv.NotFound):
            await self.client.exec_command(sid, "true")

    async def test_exec_timeout_kills_the_command(self):
        sid = await self.new_sandbox()
        start = time.monotonic()
        res = await self.client.exec_command(sid, "echo started; sleep 30", timeout=1)
        self.assertTrue(res.get("timedOut"))
        self.assertIn("started", res["stdout"])
        self.assertLess(time.monotonic() - start, 15)

    async def test_files_text_and_bytes(self):
        sid = await self.new_sandbox()
        await self.client.write_file(sid, "/tmp/dir/a.txt", "héllo\nworld\n")
        self.assertEqual(await self.client.read_file(sid, "/tmp/dir/a.txt"), "héllo\nworld\n")
        blob = os.urandom(300_000)
        await self.client.write_file(sid, "/tmp/blob.bin", blob)
        self.assertEqual(await self.client.read_file(sid, "/tmp/blob.bin", binary=True), blob)
        res = await self.client.exec_command(sid, "wc -c < /tmp/blob.bin; cat /tmp/dir/a.txt")
        self.assertEqual(res["stdout"], "300000\nhéllo\nworld\n")
        with self.assertRaises(aenv.NotFound):
            await self.client.read_file(sid, "/tmp/missing")
        with self.assertRaises(aenv.BadRequest):
            await self.client.read_file(sid, "relative/path")

    async def test_set_timeout_moves_the_deadline(self):
        sid = await self.new_sandbox(timeout_s=60)
        before = (await self.client.get_sandbox(sid))["endAt"]
        await self.client.set_timeout(sid, 3600)
        after = (await self.client.get_sandbox(sid))["endAt"]
        self.assertGreater(after, before)  # RFC 3339 UTC strings sort by time

    async def test_list_filters_by_metadata(self):
        mine = {await self.new_sandbox(metadata={"run": self.run_id, "i": str(i)}) for i in range(3)}
        listed = await self.client.list_sandboxes(metadata={"run": self.run_id})
        self.assertEqual({s["sandboxID"] for s in listed}, mine)
        one = await self.client.list_sandboxes(metadata={"run": self.run_id, "i": "1"})
        self.assertEqual(len(one), 1)
        paged = await self.client.list_sandboxes(state="running", metadata={"run": self.run_id}, limit=2)
        self.assertEqual(len(paged), 2)

    async def test_errors_are_mapped(self):
        with self.assertRaises(aenv.NotFound):
            await self.client.get_sandbox("nosuchsandbox0000000")
        with self.assertRaises(aenv.NotFound):
            await self.client.create_sandbox("no-such-template-" + self.run_id)
        with self.assertRaises(aenv.BadRequest):
            await self.client.create_sandbox(TEMPLATE, timeout_s=-1)
        async with aenv.AsyncClient(self.url, "wrong-key") as bad:
            with self.assertRaises(aenv.AuthError) as caught:
                await bad.list_sandboxes()
            self.assertEqual(caught.exception.status, 401)

    async def test_secrets(self):
        name = "py-" + self.run_id
        made = await self.client.create_secret(name, "py-secret-value", {"owner": "py"})
        self.assertEqual(made["currentVersion"], 1)
        self.assertNotIn("py-secret-value", repr(made))
        updated = await self.client.update_secret(name, "py-secret-value-2")
        self.assertEqual((updated["currentVersion"], updated["metadata"]), (2, {"owner": "py"}))
        self.assertEqual((await self.client.get_secret(made["secretID"]))["name"], name.lower())
        self.assertIn(made["secretID"], [s["secretID"] for s in await self.client.list_secrets()])
        with self.assertRaises(aenv.BadRequest):
            await self.client.create_secret("sec_reserved", "v")
        with self.assertRaises(aenv.Conflict):
            await self.client.create_secret(name, "again")
        await self.client.delete_secret(made["secretID"])
        with self.assertRaises(aenv.NotFound):
            await self.client.get_secret(made["secretID"])

    async def test_volume_mounted_outlives_its_sandbox(self):
        vol = await self.client.create_volume("py-" + self.run_id)
        self.addAsyncCleanup(self.client.delete_volume, vol.volume_id)
        self.assertEqual((await self.client.get_volume(vol.name)).volume_id, vol.volume_id)
        self.assertIn(vol.volume_id, [v["volumeID"] for v in await self.client.list_volumes()])
        await self.client.write_volume_file(vol, "/seed/a.txt", "seeded")
        sid = await self.new_sandbox(volume_mounts={"/mnt/v": vol, "/mnt/ro": {"name": vol.name, "read_only": True}})
        res = await self.client.exec_command(sid, "cat /mnt/v/seed/a.txt; echo inside > /mnt/v/b.txt; touch /mnt/ro/c 2>&1")
        self.assertTrue(res["stdout"].startswith("seeded"), res)
        self.assertIn("Read-only file system", res["stdout"])
        self.assertEqual(await self.client.read_volume_file(vol, "/b.txt"), "inside\n")
        info = await self.client.get_sandbox(sid)
        self.assertEqual(sorted(m["path"] for m in info["volumeMounts"]), ["/mnt/ro", "/mnt/v"])
        with self.assertRaises(aenv.Conflict):
            await self.client.delete_volume(vol.volume_id)
        await self.client.delete_sandbox(sid)
        self.assertEqual(await self.client.read_volume_file(vol, "/b.txt", binary=True), b"inside\n")

    async def test_100_concurrent_exec_from_one_loop(self):
        sid = await self.new_sandbox()
        results = await asyncio.gather(*[self.client.exec_command(sid, f"echo {i}") for i in range(100)])
        wrong = [(i, r) for i, r in enumerate(results) if r["stdout"] != f"{i}\n"]
        self.assertEqual(wrong, [], f"{len(wrong)} of 100 concurrent commands came back with the wrong output")
        self.assertLessEqual(self.client.connections_opened, 100 + 1)

    async def test_many_sandboxes_concurrently(self):
        ids = await asyncio.gather(*[self.new_sandbox() for _ in range(8)])
        results = await asyncio.gather(*[self.client.exec_command(i, "cat /proc/sys/kernel/hostname")
                                         for i in ids])
        self.assertTrue(all(r["exitCode"] == 0 for r in results))


class TestSandboxEnv(AsyncServerTest):
    def env(self, **kwargs) -> aenv.SandboxEnv:
        kwargs.setdefault("create_kwargs", {"timeout_s": 300, "metadata": {"run": self.run_id}})
        env = aenv.SandboxEnv(self.client, TEMPLATE, **kwargs)
        self.addAsyncCleanup(env.close)
        return env

    async def test_reset_step_reward_done(self):
        def reward(action, result, env):
            return 1.0 if "win" in result["stdout"] else -0.1

        async def setup(env):
            await env.write_file("/work/state.txt", "0\n")

        env = self.env(reward_fn=reward, done_fn=lambda a, r, e: "win" in r["stdout"],
                       observe="cat /work/state.txt", cwd="/work", setup=setup, max_steps=5)
        self.assertEqual(await env.reset(), "0\n")
        self.assertFalse(env.reset_info["infra_error"])
        obs, reward_1, done, info = await env.step("echo 1 > state.txt")
        self.assertEqual((obs, reward_1, done, info["exit_code"], info["infra_error"]), ("1\n", -0.1, False, 0, False))
        obs, reward_2, done, info = await env.step("echo win; echo 2 > state.txt")
        self.assertEqual((obs, reward_2, done, info["step"]), ("2\n", 1.0, True, 2))
        with self.assertRaises(RuntimeError):
            await env.step("true")

        first = env.sandbox_id
        self.assertEqual(await env.reset(), "0\n")  # a new sandbox, fresh state
        self.assertNotEqual(env.sandbox_id, first)
        with self.assertRaises(aenv.NotFound):
            await self.client.get_sandbox(first)

    async def test_max_steps_truncates(self):
        env = self.env(max_steps=2)
        await env.reset()
        self.assertFalse((await env.step("true"))[2])
        _, _, done, info = await env.step("true")
        self.assertTrue(done and info["truncated"])

    async def test_dead_sandbox_is_an_infra_error(self):
        env = self.env()
        await env.reset()
        await self.client.delete_sandbox(env.sandbox_id)  # the sandbox dies under the env
        obs, reward, done, info = await env.step("echo hi")
        self.assertEqual((obs, reward, done, info["infra_error"]), (None, 0.0, True, True))
        self.assertIsInstance(info["exception"], aenv.NotFound)
        self.assertTrue((await env.step("echo hi"))[3]["infra_error"])

    async def test_create_failure_is_an_infra_error_but_a_bad_template_raises(self):
        dead = aenv.AsyncClient("http://127.0.0.1:9", self.key, retry=aenv.RetryPolicy(max_attempts=1))
        self.addAsyncCleanup(dead.close)
        env = aenv.SandboxEnv(dead, TEMPLATE)
        self.assertIsNone(await env.reset())
        self.assertTrue(env.reset_info["infra_error"])
        self.assertTrue((await env.step("true"))[3]["infra_error"])
        with self.assertRaises(aenv.NotFound):
            await aenv.SandboxEnv(self.client, "no-such-template-" + self.run_id).reset()

    async def test_a_failing_command_is_not_an_infra_error(self):
        env = self.env()
        await env.reset()
        obs, _, done, info = await env.step("echo out; echo err >&2; exit 7")
        self.assertEqual((obs, done, info["exit_code"], info["infra_error"]), ("out\nerr\n", False, 7, False))
        _, _, _, info = await env.step("sleep 10")
        self.assertFalse(info["infra_error"])
        env.step_timeout = 1
        _, _, _, info = await env.step("sleep 10")
        self.assertTrue(info["timed_out"])
        self.assertFalse(info["infra_error"])


def delete_quietly(client: aenv.Client, sandbox_id: str) -> None:
    try:
        client.delete_sandbox(sandbox_id)
    except aenv.NotFound:
        pass


class TestSyncClient(unittest.TestCase):
    def test_sync_client_round_trip(self):
        url, key = support.real_server(self)
        c = aenv.Client(url, key, timeout=120)
        self.addCleanup(c.close)
        sid = c.create_sandbox(TEMPLATE, timeout_s=120)
        self.addCleanup(delete_quietly, c, sid)
        c.write_file(sid, "/tmp/x", b"\x00\x01binary")
        self.assertEqual(c.read_file(sid, "/tmp/x", binary=True), b"\x00\x01binary")
        self.assertEqual(c.exec_command(sid, "cat /tmp/x | wc -c")["stdout"].strip(), "8")
        c.set_timeout(sid, 200)
        self.assertEqual(c.get_sandbox(sid)["state"], "running")
        c.delete_sandbox(sid)
        with self.assertRaises(aenv.NotFound):
            c.get_sandbox(sid)


class TestExample(unittest.TestCase):
    def test_grpo_example_runs_end_to_end(self):
        url, key = support.real_server(self)
        env = dict(os.environ, AENV_URL=url, AENV_API_KEY=key, PYTHONPATH=support.SRC)
        proc = subprocess.run([sys.executable, EXAMPLE, "--short"], env=env, capture_output=True,
                              text=True, timeout=600)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("success rate", proc.stdout)
        self.assertIn("advantage=", proc.stdout)
        self.assertIn("Timings", proc.stdout)
        with aenv.Client(url, key) as c:  # the example cleaned up after itself
            left = c.list_sandboxes(metadata={"example": "grpo_rollouts"})
        self.assertEqual(left, [])


if __name__ == "__main__":
    unittest.main()
