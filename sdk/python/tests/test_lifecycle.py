"""Pause, resume, fork, snapshots and templates against a real server.

Opt-in with AENV_LIFECYCLE=1 (plus AENV_URL and AENV_API_KEY): these
endpoints are the server's newest."""

from __future__ import annotations

import asyncio
import uuid

import support
import aenv
from test_integration import TEMPLATE, AsyncServerTest

# A process whose memory state shows in a file: it counts once a second.
COUNTER = "nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done' >/dev/null 2>&1 &"


class LifecycleTest(AsyncServerTest):
    async def asyncSetUp(self):
        support.real_server(self, "AENV_LIFECYCLE")
        await super().asyncSetUp()

    async def count(self, sandbox_id: str) -> int:
        return int((await self.client.read_file(sandbox_id, "/tmp/count")).strip())


class TestPauseResume(LifecycleTest):
    async def test_pause_keeps_state_and_resume_continues(self):
        sid = await self.new_sandbox()
        await self.client.exec_command(sid, COUNTER)
        await asyncio.sleep(2)
        await self.client.pause_sandbox(sid)
        self.assertEqual((await self.client.get_sandbox(sid))["state"], "paused")
        with self.assertRaises(aenv.Conflict):
            await self.client.pause_sandbox(sid)
        listed = await self.client.list_sandboxes(state="paused", metadata={"run": self.run_id})
        self.assertEqual([s["sandboxID"] for s in listed], [sid])

        await self.client.resume_sandbox(sid)
        self.assertEqual((await self.client.get_sandbox(sid))["state"], "running")
        before = await self.count(sid)
        await asyncio.sleep(2.5)
        self.assertGreater(await self.count(sid), before)  # the process kept counting
        await self.client.resume_sandbox(sid)  # resuming a running sandbox is harmless


class TestFork(LifecycleTest):
    async def test_children_share_state_then_diverge(self):
        sid = await self.new_sandbox()
        await self.client.write_file(sid, "/tmp/parent.txt", "from parent")
        await self.client.exec_command(sid, COUNTER)
        await asyncio.sleep(2)
        children = await self.client.fork_sandbox(sid, count=3)
        self.created.extend(children)
        self.assertEqual(len(children), 3, children.errors)
        self.assertEqual(len(set(children) | {sid}), 4)
        for i, child in enumerate(children):
            self.assertEqual(await self.client.read_file(child, "/tmp/parent.txt"), "from parent")
            self.assertGreaterEqual(await self.count(child), 1)
            await self.client.write_file(child, "/tmp/mine.txt", f"child {i}")
        for i, child in enumerate(children):
            self.assertEqual(await self.client.read_file(child, "/tmp/mine.txt"), f"child {i}")
        with self.assertRaises(aenv.NotFound):
            await self.client.read_file(sid, "/tmp/mine.txt")
        self.assertEqual((await self.client.get_sandbox(sid))["state"], "running")

    async def test_bad_counts_and_unknown_parent(self):
        sid = await self.new_sandbox()
        with self.assertRaises(aenv.BadRequest):
            await self.client.fork_sandbox(sid, count=0)
        with self.assertRaises(aenv.NotFound):
            await self.client.fork_sandbox("nosuchsandbox0000000", count=1)

    async def test_sandbox_env_fork(self):
        env = aenv.SandboxEnv(self.client, TEMPLATE, cwd="/tmp",
                              reward_fn=lambda a, r, e: float(r["stdout"].strip() == "base"),
                              create_kwargs={"timeout_s": 300, "metadata": {"run": self.run_id}})
        self.addAsyncCleanup(env.close)
        await env.reset()
        await env.step("echo base > state")
        children = await env.fork(2)
        for child in children:
            self.addAsyncCleanup(child.close)
        self.assertEqual(len(children), 2)
        for child in children:
            self.assertIsNone(child.infra_error)
            self.assertEqual(child.steps, 1)
            _, reward, _, info = await child.step("cat state")
            self.assertEqual((reward, info["step"], info["infra_error"]), (1.0, 2, False))


class TestSnapshotsAndTemplates(LifecycleTest):
    async def test_snapshot_boot_has_the_captured_files_only(self):
        sid = await self.new_sandbox()
        await self.client.write_file(sid, "/tmp/before.txt", "before")
        name = f"pytest-{uuid.uuid4().hex[:8]}"
        snap = await self.client.create_snapshot(sid, name=name)
        self.addAsyncCleanup(self.client.delete_snapshot, snap)
        await self.client.write_file(sid, "/tmp/after.txt", "after")
        self.assertIn(snap, [s["snapshotID"] for s in await self.client.list_snapshots(sandbox_id=sid)])

        for ref in (snap, name):
            child = await self.client.create_sandbox(ref, timeout_s=120)
            self.created.append(child)
            self.assertEqual(await self.client.read_file(child, "/tmp/before.txt"), "before")
            with self.assertRaises(aenv.NotFound):
                await self.client.read_file(child, "/tmp/after.txt")

    async def test_template_from_sandbox(self):
        sid = await self.new_sandbox()
        await self.client.write_file(sid, "/tmp/tpl.txt", "in template")
        template_id = await self.client.create_template(sid, f"pytest-{uuid.uuid4().hex[:8]}")
        self.addAsyncCleanup(self.client.delete_snapshot, template_id)
        child = await self.client.create_sandbox(template_id, timeout_s=120)
        self.created.append(child)
        self.assertEqual(await self.client.read_file(child, "/tmp/tpl.txt"), "in template")


if __name__ == "__main__":
    import unittest
    unittest.main()
