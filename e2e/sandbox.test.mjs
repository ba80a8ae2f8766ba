// Control plane through the E2B SDK: create, connect, list with paging and
// filters, getInfo, setTimeout, isRunning, kill, getMetrics, auth errors.

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import {
  Sandbox, SandboxError, SandboxNotFoundError, NotFoundError, AuthenticationError, TimeoutError,
} from 'e2b'
import { useServer, rejectsWith, eventually } from './harness.mjs'

describe('sandbox control plane', () => {
  useServer({ before, after })

  // runTag marks this run's sandboxes so list filters see only them.
  const runTag = randomBytes(6).toString('hex')

  // nearMs asserts that two instants are within toleranceMs.
  function nearMs(actual, expected, toleranceMs, what) {
    const diff = Math.abs(actual.getTime() - expected.getTime())
    assert.ok(diff <= toleranceMs, `${what}: ${actual.toISOString()} is ${diff} ms from ${expected.toISOString()}`)
  }

  describe('create and getInfo', () => {
    let sbx
    const metadata = { run: runTag, role: 'create-test', 'with space': 'a&b=c/d?e' }
    before(async () => {
      sbx = await Sandbox.create('base', { timeoutMs: 120_000, metadata, envs: { AENV_E2E: 'from create', SHARED: 'sandbox' } })
    })
    after(async () => { await sbx?.kill() })

    test('sandbox id is 20 characters of [a-z0-9]', () => {
      assert.match(sbx.sandboxId, /^[a-z0-9]{20}$/)
    })

    test('getInfo reports template, metadata, state, resources and deadline', async () => {
      const info = await sbx.getInfo()
      assert.equal(info.sandboxId, sbx.sandboxId)
      assert.equal(info.templateId.length > 0, true)
      assert.deepEqual(info.metadata, metadata)
      assert.equal(info.state, 'running')
      assert.ok(info.cpuCount > 0, `cpuCount ${info.cpuCount}`)
      assert.ok(info.memoryMB > 0, `memoryMB ${info.memoryMB}`)
      assert.match(info.envdVersion, /^\d+\.\d+\.\d+/)
      assert.ok(info.startedAt instanceof Date && !isNaN(info.startedAt))
      nearMs(info.startedAt, new Date(), 30_000, 'startedAt')
      nearMs(info.endAt, new Date(info.startedAt.getTime() + 120_000), 5_000, 'endAt = startedAt + timeout')
      assert.equal(info.lifecycle?.onTimeout, 'kill')
    })

    test('static getInfo agrees with the instance', async () => {
      const info = await Sandbox.getInfo(sbx.sandboxId)
      assert.equal(info.sandboxId, sbx.sandboxId)
      assert.deepEqual(info.metadata, metadata)
    })

    test('envs given at create reach every command; command envs win', async () => {
      const r = await sbx.commands.run('echo "$AENV_E2E|$SHARED"')
      assert.equal(r.stdout, 'from create|sandbox\n')
      const r2 = await sbx.commands.run('echo "$AENV_E2E|$SHARED"', { envs: { SHARED: 'command' } })
      assert.equal(r2.stdout, 'from create|command\n')
    })

    test('envs given at create reach a PTY too', async () => {
      let out = ''
      const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += Buffer.from(d).toString() } })
      await sbx.pty.sendInput(pty.pid, Buffer.from('echo "[$AENV_E2E]"; exit\n'))
      await pty.wait().catch(() => {})
      assert.match(out, /\[from create\]/)
    })

    test('isRunning is true', async () => {
      assert.equal(await sbx.isRunning(), true)
    })
  })

  describe('create defaults and errors', () => {
    test('create without arguments uses the base template and a 300 s timeout', async () => {
      const sbx = await Sandbox.create()
      try {
        const info = await sbx.getInfo()
        assert.equal(info.state, 'running')
        nearMs(info.endAt, new Date(info.startedAt.getTime() + 300_000), 5_000, 'default endAt')
        assert.deepEqual(info.metadata, {})
      } finally {
        await sbx.kill()
      }
    })

    test('create from an unknown template fails with a SandboxError', async () => {
      await rejectsWith(Sandbox.create('no-such-template-' + runTag), SandboxError, 'create unknown template')
    })

    test('a wrong API key gives AuthenticationError', async () => {
      await rejectsWith(Sandbox.create('base', { apiKey: 'wrong-key' }), AuthenticationError, 'create')
      await rejectsWith(Sandbox.list({ apiKey: 'wrong-key' }).nextItems(), AuthenticationError, 'list')
      await rejectsWith(Sandbox.getInfo('a'.repeat(20), { apiKey: 'wrong-key' }), AuthenticationError, 'getInfo')
      await rejectsWith(Sandbox.kill('a'.repeat(20), { apiKey: 'wrong-key' }), AuthenticationError, 'kill')
    })
  })

  describe('setTimeout', () => {
    let sbx
    before(async () => { sbx = await Sandbox.create('base', { timeoutMs: 60_000, metadata: { run: runTag } }) })
    after(async () => { await sbx?.kill() })

    test('extending moves endAt to now + timeout', async () => {
      await sbx.setTimeout(600_000)
      const info = await sbx.getInfo()
      nearMs(info.endAt, new Date(Date.now() + 600_000), 5_000, 'endAt after setTimeout(600s)')
    })

    test('shortening moves endAt back', async () => {
      await sbx.setTimeout(90_000)
      const info = await sbx.getInfo()
      nearMs(info.endAt, new Date(Date.now() + 90_000), 5_000, 'endAt after setTimeout(90s)')
    })

    test('static setTimeout works by id', async () => {
      await Sandbox.setTimeout(sbx.sandboxId, 200_000)
      const info = await Sandbox.getInfo(sbx.sandboxId)
      nearMs(info.endAt, new Date(Date.now() + 200_000), 5_000, 'endAt after Sandbox.setTimeout(200s)')
    })

    test('setTimeout of an unknown sandbox gives SandboxNotFoundError', async () => {
      await rejectsWith(Sandbox.setTimeout('0'.repeat(20), 60_000), SandboxNotFoundError, 'setTimeout unknown')
    })
  })

  describe('sandbox timeout expiry', () => {
    test('a sandbox is gone once its timeout passes', async () => {
      const sbx = await Sandbox.create('base', { timeoutMs: 3_000, metadata: { run: runTag } })
      assert.equal(await sbx.isRunning(), true)
      await eventually(async () => {
        assert.equal(await sbx.isRunning(), false)
      }, { timeoutMs: 20_000, intervalMs: 500 })
      // A gateway lists from the cluster's database, whose record the node
      // removes just after the sandbox stops answering as running.
      await eventually(async () => {
        const listed = await Sandbox.list({ query: { metadata: { run: runTag } } }).nextItems()
        assert.ok(!listed.some((s) => s.sandboxId === sbx.sandboxId), 'expired sandbox still listed')
      }, { timeoutMs: 10_000, intervalMs: 250 })
      assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    })
  })

  describe('kill', () => {
    test('kill, then everything about the sandbox reports it gone', async () => {
      const sbx = await Sandbox.create('base', { timeoutMs: 60_000, metadata: { run: runTag } })
      assert.equal(await sbx.isRunning(), true)
      assert.equal(await sbx.kill(), true)
      assert.equal(await sbx.isRunning(), false)
      assert.equal(await sbx.kill(), false, 'second kill')
      assert.equal(await Sandbox.kill(sbx.sandboxId), false, 'static kill of a killed sandbox')
      await rejectsWith(sbx.getInfo(), SandboxNotFoundError, 'getInfo after kill')
      await rejectsWith(sbx.setTimeout(60_000), SandboxNotFoundError, 'setTimeout after kill')
      await rejectsWith(sbx.getMetrics(), SandboxNotFoundError, 'getMetrics after kill')
      // envd traffic to a killed sandbox gets 502 from the proxy, which the SDK
      // reports as "not running" for streams and as a timeout for unary calls.
      await rejectsWith(sbx.commands.run('true'), SandboxError, 'commands.run after kill')
      await rejectsWith(sbx.files.read('/etc/hostname'), TimeoutError, 'files.read after kill')
      await rejectsWith(sbx.files.list('/'), SandboxError, 'files.list after kill')
    })

    test('static kill by id', async () => {
      const sbx = await Sandbox.create('base', { timeoutMs: 60_000, metadata: { run: runTag } })
      assert.equal(await Sandbox.kill(sbx.sandboxId), true)
      assert.equal(await sbx.isRunning(), false)
    })

    test('kill of an unknown id is false', async () => {
      assert.equal(await Sandbox.kill('unknownsandbox00000x'), false)
      assert.equal(await Sandbox.kill('x'), false)
    })

    test('getInfo of an unknown id gives SandboxNotFoundError', async () => {
      const err = await rejectsWith(Sandbox.getInfo('unknownsandbox00000x'), SandboxNotFoundError, 'getInfo unknown')
      assert.ok(err instanceof NotFoundError)
    })
  })

  describe('connect', () => {
    let sbx
    before(async () => { sbx = await Sandbox.create('base', { timeoutMs: 120_000, metadata: { run: runTag } }) })
    after(async () => { await sbx?.kill() })

    test('Sandbox.connect to a running sandbox gives a working handle', async () => {
      await sbx.files.write('/tmp/connect-marker', 'hello from the first handle')
      const again = await Sandbox.connect(sbx.sandboxId)
      assert.equal(again.sandboxId, sbx.sandboxId)
      assert.equal(await again.files.read('/tmp/connect-marker'), 'hello from the first handle')
      const r = await again.commands.run('echo connected')
      assert.equal(r.stdout, 'connected\n')
      assert.equal(await again.isRunning(), true)
    })

    test('connect extends the timeout but never shortens it', async () => {
      await Sandbox.connect(sbx.sandboxId, { timeoutMs: 900_000 })
      let info = await sbx.getInfo()
      nearMs(info.endAt, new Date(Date.now() + 900_000), 5_000, 'endAt after connect(900s)')
      await Sandbox.connect(sbx.sandboxId, { timeoutMs: 30_000 })
      info = await sbx.getInfo()
      nearMs(info.endAt, new Date(Date.now() + 900_000), 10_000, 'endAt after connect(30s) must stay')
    })

    test('instance connect() works', async () => {
      const same = await sbx.connect()
      assert.equal(same.sandboxId, sbx.sandboxId)
      assert.equal((await same.commands.run('echo ok')).stdout, 'ok\n')
    })

    test('connect to an unknown sandbox gives SandboxNotFoundError', async () => {
      await rejectsWith(Sandbox.connect('unknownsandbox00000x'), SandboxNotFoundError, 'connect unknown')
    })

    test('connect to a killed sandbox gives SandboxNotFoundError', async () => {
      const dead = await Sandbox.create('base', { timeoutMs: 60_000 })
      await dead.kill()
      await rejectsWith(Sandbox.connect(dead.sandboxId), SandboxNotFoundError, 'connect killed')
    })
  })

  describe('list', () => {
    const listTag = randomBytes(6).toString('hex')
    const created = []
    const count = 5
    before(async () => {
      for (let i = 0; i < count; i++) {
        // Sequential creation gives distinct start times, so the order is known.
        created.push(await Sandbox.create('base', {
          timeoutMs: 180_000,
          metadata: { list: listTag, index: String(i), odd: String(i % 2 === 1), tricky: 'x y&z=1%2' },
        }))
        await sleep(20)
      }
    })
    after(async () => { await Promise.all(created.map((s) => s.kill())) })

    test('the metadata filter finds exactly the matching sandboxes', async () => {
      const items = await Sandbox.list({ query: { metadata: { list: listTag } } }).nextItems()
      assert.deepEqual(items.map((s) => s.sandboxId).sort(), created.map((s) => s.sandboxId).sort())
      for (const s of items) {
        assert.equal(s.state, 'running')
        assert.equal(s.metadata.list, listTag)
        assert.equal(s.metadata.tricky, 'x y&z=1%2')
        assert.ok(s.startedAt instanceof Date && s.endAt > s.startedAt)
        assert.ok(s.cpuCount > 0 && s.memoryMB > 0)
        assert.match(s.envdVersion, /^\d+\.\d+\.\d+/)
      }
    })

    test('metadata filters with several keys and special characters are ANDed', async () => {
      const odd = await Sandbox.list({ query: { metadata: { list: listTag, odd: 'true', tricky: 'x y&z=1%2' } } }).nextItems()
      assert.deepEqual(odd.map((s) => s.metadata.index).sort(), ['1', '3'])
      const none = await Sandbox.list({ query: { metadata: { list: listTag, tricky: 'x y' } } }).nextItems()
      assert.deepEqual(none, [])
    })

    test('the state filter: running lists them, paused does not', async () => {
      const running = await Sandbox.list({ query: { metadata: { list: listTag }, state: ['running'] } }).nextItems()
      assert.equal(running.length, count)
      const paused = await Sandbox.list({ query: { metadata: { list: listTag }, state: ['paused'] } }).nextItems()
      assert.deepEqual(paused, [])
      const both = await Sandbox.list({ query: { metadata: { list: listTag }, state: ['running', 'paused'] } }).nextItems()
      assert.equal(both.length, count)
    })

    test('paging with limit 2 walks every sandbox exactly once, newest first', async () => {
      const paginator = Sandbox.list({ query: { metadata: { list: listTag } }, limit: 2 })
      const pages = []
      while (paginator.hasNext) {
        const page = await paginator.nextItems()
        pages.push(page.map((s) => s.metadata.index))
        assert.ok(pages.length <= 10, 'paginator does not end')
      }
      assert.deepEqual(pages.map((p) => p.length), [2, 2, 1])
      assert.deepEqual(pages.flat(), ['4', '3', '2', '1', '0'])
    })

    test('paging with order asc', async () => {
      const paginator = Sandbox.list({ query: { metadata: { list: listTag } }, limit: 3, order: 'asc' })
      const ids = []
      while (paginator.hasNext) ids.push(...(await paginator.nextItems()).map((s) => s.metadata.index))
      assert.deepEqual(ids, ['0', '1', '2', '3', '4'])
    })

    test('a limit equal to the count gives one page and no next token', async () => {
      const paginator = Sandbox.list({ query: { metadata: { list: listTag } }, limit: count })
      const items = await paginator.nextItems()
      assert.equal(items.length, count)
      assert.equal(paginator.hasNext, false)
    })

    test('killed sandboxes leave the list', async () => {
      const extra = await Sandbox.create('base', { timeoutMs: 60_000, metadata: { list: listTag + '-k' } })
      let items = await Sandbox.list({ query: { metadata: { list: listTag + '-k' } } }).nextItems()
      assert.equal(items.length, 1)
      await extra.kill()
      items = await Sandbox.list({ query: { metadata: { list: listTag + '-k' } } }).nextItems()
      assert.equal(items.length, 0)
    })
  })

  describe('getMetrics', () => {
    test('reports the sandbox memory and CPU as real numbers', async () => {
      const sbx = await Sandbox.create('base', { timeoutMs: 60_000, metadata: { run: runTag } })
      try {
        // Make the sandbox use some memory and CPU first.
        await sbx.commands.run('head -c 50000000 /dev/zero | tail -c 1000 >/dev/null; python3 -c 1 2>/dev/null; true')
        const metrics = await eventually(async () => {
          const m = await sbx.getMetrics()
          assert.ok(m.length > 0, 'no metrics yet')
          return m
        }, { timeoutMs: 15_000, intervalMs: 1000 })
        const last = metrics[metrics.length - 1]
        assert.ok(last.timestamp instanceof Date && !isNaN(last.timestamp))
        nearMs(last.timestamp, new Date(), 120_000, 'metrics timestamp')
        assert.ok(Number.isFinite(last.memUsed) && last.memUsed > 0, `memUsed ${last.memUsed}`)
        assert.ok(Number.isFinite(last.memTotal) && last.memTotal > 0, `memTotal ${last.memTotal}`)
        assert.ok(last.memUsed <= last.memTotal, `memUsed ${last.memUsed} > memTotal ${last.memTotal}`)
        assert.ok(last.cpuCount > 0, `cpuCount ${last.cpuCount}`)
        assert.ok(Number.isFinite(last.cpuUsedPct) && last.cpuUsedPct >= 0, `cpuUsedPct ${last.cpuUsedPct}`)
        const stat = await Sandbox.getMetrics(sbx.sandboxId)
        assert.ok(stat.length > 0)
      } finally {
        await sbx.kill()
      }
    })

    test('getMetrics of an unknown sandbox gives SandboxNotFoundError', async () => {
      await rejectsWith(Sandbox.getMetrics('unknownsandbox00000x'), SandboxNotFoundError, 'getMetrics unknown')
    })
  })
})
