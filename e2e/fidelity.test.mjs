// What E2B's own SDK tests and everyday agents take for granted: sudo for
// the default user (fresh, restored from a snapshot, resumed and forked
// sandboxes), `python` in the base template, every list filter the SDK
// sends, maskRequestHost on exposed ports, Template.exists, and metrics
// over a time range.

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import http from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import { Sandbox, Template, SandboxNotFoundError } from 'e2b'
import { useServer, eventually } from './harness.mjs'

// hostHeaderEcho answers every GET with "<Host>|<X-Forwarded-Host>".
const hostHeaderEcho = `
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (self.headers.get('Host', '') + '|' + self.headers.get('X-Forwarded-Host', '')).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(('0.0.0.0', int(sys.argv[1])), H).serve_forever()
`

// getThroughServer sends GET / to the aenv server with the given Host
// header (an exposed-port host, <port>-<id>.<domain>) and returns the
// status and body.
function getThroughServer(server, host) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: server.port, path: '/', headers: { Host: host } }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }))
    })
    req.on('error', reject)
    req.end()
  })
}

describe('E2B fidelity', () => {
  const server = useServer({ before, after })
  const runTag = randomBytes(6).toString('hex')
  const created = []
  const track = (sbx) => { created.push(sbx); return sbx }
  before(() => {
    server.defer(() => Promise.all(created.map((s) => s.kill().catch(() => {}))))
  })

  let sbx
  before(async () => {
    sbx = track(await Sandbox.create('base', { timeoutMs: 600_000, metadata: { run: runTag } }))
  })

  describe('sudo for the default user', () => {
    // assertSudo checks what agents do with sudo, as the default user.
    async function assertSudo(s, what) {
      const id = await s.commands.run('whoami; sudo -n id -u')
      assert.equal(id.stdout, 'user\n0\n', `${what}: sudo -n id -u`)
      const apt = await s.commands.run('sudo -n apt-get --version')
      assert.match(apt.stdout, /^apt \d/, `${what}: sudo -n apt-get --version`)
      const marker = `${what} ${runTag}`
      await s.commands.run(`echo '${marker}' | sudo -n tee /etc/x >/dev/null`)
      const written = await s.commands.run('stat -c %U /etc/x; cat /etc/x')
      assert.equal(written.stdout, `root\n${marker}\n`, `${what}: file written with sudo tee`)
    }

    test('in a fresh sandbox', async () => {
      await assertSudo(sbx, 'fresh')
    })

    test('in a sandbox restored from a snapshot', async () => {
      const snap = await sbx.createSnapshot()
      server.defer(() => Sandbox.deleteSnapshot(snap.snapshotId).catch(() => {}))
      const child = track(await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000 }))
      await assertSudo(child, 'restored')
      await child.kill()
    })

    test('in a paused and resumed sandbox', async () => {
      const s = track(await Sandbox.create('base', { timeoutMs: 120_000 }))
      assert.equal(await s.pause(), true)
      const resumed = await Sandbox.connect(s.sandboxId, { timeoutMs: 120_000 })
      await assertSudo(resumed, 'resumed')
      await resumed.kill()
    })

    test('in a forked sandbox', async () => {
      const [child] = await Sandbox.fork(sbx.sandboxId, { count: 1, timeoutMs: 120_000 })
      assert.ok(!(child instanceof Error), `fork failed: ${child?.message}`)
      track(child)
      await assertSudo(child, 'forked')
      await child.kill()
    })
  })

  describe('python in the base template', () => {
    test('python is Python 3', async () => {
      const r = await sbx.commands.run('python --version')
      assert.match(r.stdout, /^Python 3\./)
    })

    test('python -m http.server serves', async () => {
      await sbx.files.write('/tmp/served/index.html', 'served by python')
      const h = await sbx.commands.run('python -m http.server 8123 --bind 127.0.0.1', { cwd: '/tmp/served', background: true, timeoutMs: 0 })
      try {
        await eventually(async () => {
          const r = await sbx.commands.run('curl -sf http://127.0.0.1:8123/index.html')
          assert.equal(r.stdout, 'served by python')
        }, { timeoutMs: 30_000, intervalMs: 500 })
      } finally {
        await h.kill()
      }
    })
  })

  describe('list filters', () => {
    test('startedAfter, state and metadata combine; pages keep the filter', async () => {
      const tag = { listed: runTag }
      const first = track(await Sandbox.create('base', { timeoutMs: 120_000, metadata: tag }))
      const firstInfo = await first.getInfo()
      // startedAt has whole-millisecond precision on the wire.
      await sleep(50)
      const cut = new Date()
      await sleep(50)
      const second = track(await Sandbox.create('base', { timeoutMs: 120_000, metadata: tag }))
      const third = track(await Sandbox.create('base', { timeoutMs: 120_000, metadata: tag }))
      assert.ok(firstInfo.startedAt < cut)

      const ids = async (query, opts = {}) => {
        const out = []
        const paginator = Sandbox.list({ query, ...opts })
        while (paginator.hasNext) out.push(...(await paginator.nextItems()).map((s) => s.sandboxId))
        return out.sort()
      }
      assert.deepEqual(await ids({ metadata: tag }), [first, second, third].map((s) => s.sandboxId).sort())
      assert.deepEqual(await ids({ metadata: tag, startedAfter: cut }), [second, third].map((s) => s.sandboxId).sort())
      assert.deepEqual(await ids({ metadata: tag, startedAfter: cut }, { limit: 1 }), [second, third].map((s) => s.sandboxId).sort())
      assert.deepEqual(await ids({ metadata: tag, startedAfter: new Date(Date.now() + 60_000) }), [])

      assert.equal(await third.pause(), true)
      assert.deepEqual(await ids({ metadata: tag, startedAfter: cut, state: ['running'] }), [second.sandboxId])
      assert.deepEqual(await ids({ metadata: tag, startedAfter: cut, state: ['paused'] }), [third.sandboxId])
      assert.deepEqual(await ids({ metadata: tag, state: ['running', 'paused'] }), [first, second, third].map((s) => s.sandboxId).sort())
      await Promise.all([first, second, third].map((s) => s.kill()))
    })
  })

  describe('maskRequestHost', () => {
    test('requests to exposed ports reach the sandbox with the masked Host', async () => {
      const masked = track(await Sandbox.create('base', { timeoutMs: 120_000, network: { maskRequestHost: 'localhost:${PORT}' } }))
      assert.equal((await masked.getInfo()).network?.maskRequestHost, 'localhost:${PORT}')
      await masked.files.write('/tmp/echo.py', hostHeaderEcho)
      await masked.commands.run('python3 /tmp/echo.py 8000', { background: true, timeoutMs: 0 })
      const host = masked.getHost(8000)
      const res = await eventually(async () => {
        const r = await getThroughServer(server, host)
        assert.equal(r.status, 200, `status ${r.status}: ${r.body}`)
        return r
      }, { timeoutMs: 30_000, intervalMs: 500 })
      assert.equal(res.body, `localhost:8000|${host}`)
      await masked.kill()
    })

    test('without a mask the Host is the one the client sent', async () => {
      await sbx.files.write('/tmp/echo.py', hostHeaderEcho)
      await sbx.commands.run('python3 /tmp/echo.py 8001', { background: true, timeoutMs: 0 })
      const host = sbx.getHost(8001)
      const res = await eventually(async () => {
        const r = await getThroughServer(server, host)
        assert.equal(r.status, 200, `status ${r.status}: ${r.body}`)
        return r
      }, { timeoutMs: 30_000, intervalMs: 500 })
      assert.equal(res.body, `${host}|`)
    })
  })

  describe('Template.exists', () => {
    test('the base template exists, an unknown name does not', async () => {
      assert.equal(await Template.exists('base'), true)
      assert.equal(await Template.exists('base:latest'), true)
      assert.equal(await Template.exists(`no-such-template-${runTag}`), false)
    })

    test('a named snapshot exists until it is deleted', async () => {
      const name = `fidelity-snap-${runTag}`
      assert.equal(await Template.exists(name), false)
      const snap = await sbx.createSnapshot({ name })
      assert.equal(await Template.exists(name), true)
      assert.equal(await Template.exists(snap.snapshotId), true)
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
      assert.equal(await Template.exists(name), false)
    })
  })

  describe('metrics over a time range', () => {
    test('getMetrics returns the samples of the range asked for', async () => {
      const s = track(await Sandbox.create('base', { timeoutMs: 120_000 }))
      // The server samples every 5 s: wait for three samples.
      const all = await eventually(async () => {
        const m = await s.getMetrics()
        assert.ok(m.length >= 3, `${m.length} samples so far`)
        return m
      }, { timeoutMs: 60_000, intervalMs: 1000 })
      for (let i = 1; i < all.length; i++) {
        assert.ok(all[i].timestamp > all[i - 1].timestamp, 'samples are in time order')
      }
      for (const m of all) {
        assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal && m.cpuCount > 0 && m.cpuUsedPct >= 0, JSON.stringify(m))
      }
      // The range is in whole seconds; samples are seconds apart.
      const mid = all[1].timestamp
      const one = await s.getMetrics({ start: mid, end: mid })
      assert.deepEqual(one.map((m) => m.timestamp.getTime()), [mid.getTime()])
      const fromMid = await s.getMetrics({ start: mid })
      assert.deepEqual(fromMid.slice(0, all.length - 1).map((m) => m.timestamp.getTime()), all.slice(1).map((m) => m.timestamp.getTime()))
      const upToMid = await s.getMetrics({ end: mid })
      assert.deepEqual(upToMid.map((m) => m.timestamp.getTime()), all.slice(0, 2).map((m) => m.timestamp.getTime()))
      assert.deepEqual(await s.getMetrics({ start: new Date(Date.now() + 60_000) }), [])
      await s.kill()
      await assert.rejects(s.getMetrics(), SandboxNotFoundError)
    })
  })
})
