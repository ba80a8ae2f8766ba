// Pause, resume, snapshots and fork through the E2B SDK (wire-spec section
// b and checklist item 11, plus aenv's fork). run.sh runs this file only
// with AENV_E2E_LIFECYCLE=1, until the server implements these calls.
//
// "Memory intact" is checked with a background bash loop that keeps its
// counter in a shell variable and writes it to a file: after a resume or in
// a fork the count must continue from where it was, not restart at 1.

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { setTimeout as sleep } from 'node:timers/promises'
import { Sandbox, SandboxError, SandboxNotFoundError, NotFoundError } from 'e2b'
import { useServer, rejectsWith, eventually } from './harness.mjs'

const counterScript = 'i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done'

// startCounter starts the in-memory counter and returns its pid.
async function startCounter(sbx) {
  const h = await sbx.commands.run(counterScript, { background: true, timeoutMs: 0 })
  await h.disconnect()
  await eventually(async () => assert.ok(await readCounter(sbx) >= 3, 'counter not running'))
  return h.pid
}

// counterNow reads the running counter, retrying a read that caught the
// file between its truncation and the write.
function counterNow(sbx) {
  return eventually(() => readCounter(sbx))
}

async function readCounter(sbx) {
  const text = await sbx.files.read('/tmp/counter')
  const n = Number(text.trim())
  // The file may be caught mid-write (truncated): retry through eventually.
  assert.ok(Number.isInteger(n) && n > 0, `counter file holds ${JSON.stringify(text)}`)
  return n
}

// assertCounterContinues checks that the counter runs and continues from
// at least `from` (a restart would begin again at 1).
async function assertCounterContinues(sbx, from, what) {
  const first = await counterNow(sbx)
  assert.ok(first >= from, `${what}: counter at ${first} < ${from} before the pause/fork: memory lost`)
  await eventually(async () => {
    const later = await readCounter(sbx)
    assert.ok(later > first, `${what}: counter stuck at ${later}`)
  }, { timeoutMs: 10_000 })
}

describe('lifecycle', () => {
  const server = useServer({ before, after })
  const created = []
  const track = (sbx) => { created.push(sbx); return sbx }
  before(() => {
    server.defer(() => Promise.all(created.map((s) => s.kill().catch(() => {}))))
  })

  describe('pause and resume', () => {
    let sbx
    let counterPid
    let countAtPause
    before(async () => {
      sbx = track(await Sandbox.create('base', { timeoutMs: 300_000, metadata: { lifecycle: 'pause' } }))
      await sbx.files.write('/home/user/kept.txt', 'survives pause')
      counterPid = await startCounter(sbx)
    })

    test('pause returns true and the sandbox is paused', async () => {
      countAtPause = await counterNow(sbx)
      assert.equal(await sbx.pause(), true)
      const info = await sbx.getInfo()
      assert.equal(info.state, 'paused')
      const listed = await Sandbox.list({ query: { metadata: { lifecycle: 'pause' }, state: ['paused'] } }).nextItems()
      assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])
      const running = await Sandbox.list({ query: { metadata: { lifecycle: 'pause' }, state: ['running'] } }).nextItems()
      assert.deepEqual(running, [])
    })

    test('a paused sandbox is not running: envd traffic gets 502', async () => {
      assert.equal(await sbx.isRunning(), false)
      const res = await fetch(`${server.url}/health`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' } })
      assert.equal(res.status, 502)
      await rejectsWith(sbx.commands.run('true'), SandboxError, 'commands.run while paused')
      await rejectsWith(sbx.files.read('/home/user/kept.txt'), SandboxError, 'files.read while paused')
    })

    test('pausing again returns false', async () => {
      assert.equal(await sbx.pause(), false)
      assert.equal(await Sandbox.pause(sbx.sandboxId), false)
    })

    test('connect resumes it with files and memory intact', async () => {
      const resumed = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 240_000 })
      assert.equal(resumed.sandboxId, sbx.sandboxId)
      const info = await resumed.getInfo()
      assert.equal(info.state, 'running')
      assert.ok(Math.abs(info.endAt.getTime() - (Date.now() + 240_000)) < 10_000, `endAt ${info.endAt.toISOString()}`)
      assert.equal(await resumed.isRunning(), true)
      assert.equal(await resumed.files.read('/home/user/kept.txt'), 'survives pause')
      await assertCounterContinues(resumed, countAtPause, 'resume')
      const procs = await resumed.commands.list()
      assert.ok(procs.some((p) => p.pid === counterPid), 'counter process not listed after resume')
    })

    test('the old handle works again after the resume', async () => {
      assert.equal((await sbx.commands.run('echo back')).stdout, 'back\n')
    })

    test('pause and resume again (instance connect)', async () => {
      const before = await counterNow(sbx)
      assert.equal(await Sandbox.pause(sbx.sandboxId), true)
      await sbx.connect()
      await assertCounterContinues(sbx, before, 'second resume')
    })

    test('pause of unknown or killed sandboxes gives SandboxNotFoundError', async () => {
      await rejectsWith(Sandbox.pause('unknownsandbox00000x'), SandboxNotFoundError, 'pause unknown')
      const dead = await Sandbox.create('base', { timeoutMs: 60_000 })
      await dead.kill()
      await rejectsWith(dead.pause(), SandboxNotFoundError, 'pause killed')
    })

    test('a paused sandbox can be killed', async () => {
      const other = track(await Sandbox.create('base', { timeoutMs: 60_000 }))
      assert.equal(await other.pause(), true)
      assert.equal(await other.kill(), true)
      await rejectsWith(Sandbox.connect(other.sandboxId), SandboxNotFoundError, 'connect after kill of paused')
    })
  })

  describe('pause without memory', () => {
    test('resume reboots: files survive, processes do not', async () => {
      const sbx = track(await Sandbox.create('base', { timeoutMs: 120_000 }))
      await sbx.files.write('/home/user/disk.txt', 'on disk')
      await startCounter(sbx)
      assert.equal(await sbx.pause({ keepMemory: false }), true)
      await Sandbox.connect(sbx.sandboxId)
      assert.equal(await sbx.files.read('/home/user/disk.txt'), 'on disk')
      const r = await sbx.commands.run("pgrep -f 'echo [$]i' || true")
      assert.equal(r.stdout.trim(), '', 'the counter survived a pause without memory')
    })

    test("connect with onResume 'reboot' drops memory", async () => {
      const sbx = track(await Sandbox.create('base', { timeoutMs: 120_000 }))
      await startCounter(sbx)
      assert.equal(await sbx.pause(), true)
      await Sandbox.connect(sbx.sandboxId, { onResume: 'reboot' })
      const r = await sbx.commands.run("pgrep -f 'echo [$]i' || true")
      assert.equal(r.stdout.trim(), '')
    })
  })

  describe('auto-pause on timeout', () => {
    test("lifecycle onTimeout 'pause' pauses instead of killing; connect resumes", async () => {
      const sbx = track(await Sandbox.create('base', { timeoutMs: 3_000, lifecycle: { onTimeout: 'pause' } }))
      assert.equal((await sbx.getInfo()).lifecycle?.onTimeout, 'pause')
      await sbx.files.write('/home/user/auto.txt', 'auto')
      const count = await startCounter(sbx).then(() => counterNow(sbx))
      await eventually(async () => assert.equal((await sbx.getInfo()).state, 'paused'), { timeoutMs: 30_000, intervalMs: 500 })
      assert.equal(await sbx.isRunning(), false)
      await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
      assert.equal(await sbx.files.read('/home/user/auto.txt'), 'auto')
      await assertCounterContinues(sbx, count, 'auto-pause resume')
    })
  })

  describe('snapshots', () => {
    let sbx
    let snapshot
    before(async () => {
      sbx = track(await Sandbox.create('base', { timeoutMs: 300_000 }))
      await sbx.files.write('/home/user/snap.txt', 'in the snapshot')
    })

    test('createSnapshot returns an id and the sandbox keeps running', async () => {
      snapshot = await sbx.createSnapshot()
      assert.ok(typeof snapshot.snapshotId === 'string' && snapshot.snapshotId.length > 0)
      assert.ok(Array.isArray(snapshot.names))
      assert.equal(await sbx.isRunning(), true)
      assert.equal((await sbx.getInfo()).state, 'running')
      // Changes after the snapshot are not in it.
      await sbx.files.write('/home/user/snap.txt', 'changed after')
    })

    test('a sandbox created from the snapshot has its files', async () => {
      const child = track(await Sandbox.create(snapshot.snapshotId, { timeoutMs: 60_000 }))
      assert.notEqual(child.sandboxId, sbx.sandboxId)
      assert.equal(await child.files.read('/home/user/snap.txt'), 'in the snapshot')
      await child.kill()
    })

    test('a named snapshot is found by name', async () => {
      const named = await sbx.createSnapshot({ name: 'e2e-named-snap' })
      assert.ok(named.names.some((n) => n.includes('e2e-named-snap')), `names ${JSON.stringify(named.names)}`)
      const found = await Sandbox.listSnapshots({ name: 'e2e-named-snap' }).nextItems()
      assert.ok(found.some((s) => s.snapshotId === named.snapshotId))
      assert.equal(await Sandbox.deleteSnapshot(named.snapshotId), true)
    })

    test('listSnapshots filters by sandbox and pages', async () => {
      const second = await sbx.createSnapshot()
      const all = []
      const paginator = Sandbox.listSnapshots({ sandboxId: sbx.sandboxId, limit: 1 })
      let pages = 0
      while (paginator.hasNext) {
        const items = await paginator.nextItems()
        assert.ok(items.length <= 1)
        all.push(...items.map((s) => s.snapshotId))
        assert.ok(++pages <= 10, 'snapshot paginator does not end')
      }
      assert.deepEqual(all.sort(), [snapshot.snapshotId, second.snapshotId].sort())
      const viaInstance = await sbx.listSnapshots().nextItems()
      assert.equal(viaInstance.length, 2)
      assert.equal(await Sandbox.deleteSnapshot(second.snapshotId), true)
    })

    test('deleteSnapshot: true, then false; gone from the list', async () => {
      assert.equal(await Sandbox.deleteSnapshot(snapshot.snapshotId), true)
      assert.equal(await Sandbox.deleteSnapshot(snapshot.snapshotId), false)
      const left = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
      assert.ok(!left.some((s) => s.snapshotId === snapshot.snapshotId))
      await rejectsWith(Sandbox.create(snapshot.snapshotId), SandboxError, 'create from a deleted snapshot')
    })

    test('createSnapshot of an unknown sandbox gives SandboxNotFoundError', async () => {
      await rejectsWith(Sandbox.createSnapshot('unknownsandbox00000x'), SandboxNotFoundError, 'snapshot unknown')
    })

    test('deleteSnapshot of an unknown snapshot is false', async () => {
      assert.equal(await Sandbox.deleteSnapshot('unknownsnapshot0000x'), false)
    })
  })

  describe('fork', () => {
    let parent
    let countAtFork
    before(async () => {
      parent = track(await Sandbox.create('base', { timeoutMs: 300_000, envs: { FORKED_ENV: 'inherited' } }))
      await parent.files.write('/home/user/parent.txt', 'from the parent')
      await startCounter(parent)
    })

    test('Sandbox.fork gives N independent children with the parent files and processes', async () => {
      countAtFork = await counterNow(parent)
      const children = await Sandbox.fork(parent.sandboxId, { count: 3, timeoutMs: 120_000 })
      assert.equal(children.length, 3)
      for (const c of children) {
        assert.ok(!(c instanceof Error), `fork failed: ${c?.message}`)
        track(c)
      }
      const ids = new Set(children.map((c) => c.sandboxId))
      assert.equal(ids.size, 3)
      assert.ok(!ids.has(parent.sandboxId))

      for (const [i, c] of children.entries()) {
        assert.equal(await c.isRunning(), true)
        assert.equal(await c.files.read('/home/user/parent.txt'), 'from the parent')
        assert.equal((await c.commands.run('echo "$FORKED_ENV"')).stdout, 'inherited\n')
        await assertCounterContinues(c, countAtFork, `fork child ${i}`)
        await c.files.write('/home/user/child.txt', `child ${i}`)
        const info = await c.getInfo()
        assert.equal(info.state, 'running')
        assert.ok(Math.abs(info.endAt.getTime() - (Date.now() + 120_000)) < 30_000, `child endAt ${info.endAt.toISOString()}`)
      }
      // Children do not share a filesystem with each other or the parent.
      for (const [i, c] of children.entries()) {
        assert.equal(await c.files.read('/home/user/child.txt'), `child ${i}`)
      }
      assert.equal(await parent.files.exists('/home/user/child.txt'), false)
      // The parent goes on running.
      assert.equal(await parent.isRunning(), true)
      await assertCounterContinues(parent, countAtFork, 'parent after fork')
    })

    test('instance fork() with the default count gives one child', async () => {
      const children = await parent.fork()
      assert.equal(children.length, 1)
      const [c] = children
      assert.ok(!(c instanceof Error), `fork failed: ${c?.message}`)
      track(c)
      assert.equal(await c.files.read('/home/user/parent.txt'), 'from the parent')
    })

    test('a paused sandbox can be forked and stays paused', async () => {
      const paused = track(await Sandbox.create('base', { timeoutMs: 120_000 }))
      await paused.files.write('/home/user/p.txt', 'paused parent')
      const count = await startCounter(paused).then(() => counterNow(paused))
      assert.equal(await paused.pause(), true)
      const [c] = await Sandbox.fork(paused.sandboxId, { count: 1 })
      assert.ok(!(c instanceof Error), `fork of paused failed: ${c?.message}`)
      track(c)
      assert.equal(await c.files.read('/home/user/p.txt'), 'paused parent')
      await assertCounterContinues(c, count, 'fork of paused')
      assert.equal((await paused.getInfo()).state, 'paused')
    })

    test('fork of an unknown sandbox gives SandboxNotFoundError', async () => {
      const err = await rejectsWith(Sandbox.fork('unknownsandbox00000x'), SandboxNotFoundError, 'fork unknown')
      assert.ok(err instanceof NotFoundError)
    })

    test('children are killed independently of the parent', async () => {
      const [c] = await Sandbox.fork(parent.sandboxId, { count: 1 })
      assert.ok(!(c instanceof Error))
      assert.equal(await c.kill(), true)
      assert.equal(await c.isRunning(), false)
      assert.equal(await parent.isRunning(), true)
      await sleep(100)
    })
  })
})
