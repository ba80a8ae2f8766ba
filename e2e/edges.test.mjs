// Edges of E2B's protocol that E2B's Python SDK leans on and the JS SDK's
// everyday calls do not show: a sandbox created with secure: false (E2B's
// v1 create), files under /proc read through GET /files (boot IDs), and a
// command's deadline ending its stream with Connect's deadline_exceeded
// (the Python SDK raises TimeoutException on that code only).

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, TimeoutError } from 'e2b'
import { useServer, rejectsWith } from './harness.mjs'

const envdPort = '49983'

// api calls the control plane with the suite's key.
function api(path, init = {}) {
  return fetch(process.env.E2B_API_URL + path, {
    ...init,
    headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json', ...init.headers },
  })
}

// envd calls a sandbox's envd through the server, as the SDK does.
function envd(sandboxId, path, init = {}) {
  return fetch(process.env.E2B_SANDBOX_URL + path, {
    ...init,
    headers: { 'E2b-Sandbox-Id': sandboxId, 'E2b-Sandbox-Port': envdPort, ...init.headers },
  })
}

// connectFrames splits a Connect streaming body into {flags, json} frames.
function connectFrames(buf) {
  const frames = []
  for (let off = 0; off + 5 <= buf.length;) {
    const len = buf.readUInt32BE(off + 1)
    frames.push({ flags: buf[off], json: JSON.parse(buf.subarray(off + 5, off + 5 + len).toString()) })
    off += 5 + len
  }
  return frames
}

function envelope(msg) {
  const data = Buffer.from(JSON.stringify(msg))
  const head = Buffer.alloc(5)
  head.writeUInt32BE(data.length, 1)
  return Buffer.concat([head, data])
}

describe('edges', () => {
  const server = useServer({ before, after })

  describe('secure: false', () => {
    let id
    before(async () => {
      const res = await api('/sandboxes', {
        method: 'POST', body: JSON.stringify({ templateID: 'base', timeout: 600, secure: false }),
      })
      const body = await res.json()
      assert.equal(res.status, 201, JSON.stringify(body))
      assert.equal('envdAccessToken' in body, false, `create answer ${JSON.stringify(body)} carries a token`)
      id = body.sandboxID
      server.defer(() => Sandbox.kill(id))
    })

    test('the SDK connects to it and runs commands and files without a token', async () => {
      const sbx = await Sandbox.connect(id)
      const r = await sbx.commands.run('echo insecure')
      assert.equal(r.stdout, 'insecure\n')
      await sbx.files.write('/tmp/insecure.txt', 'plain')
      assert.equal(await sbx.files.read('/tmp/insecure.txt'), 'plain')
    })

    test('envd answers a call that carries no token', async () => {
      const res = await envd(id, '/files?path=/tmp/insecure.txt&username=user')
      assert.equal(res.status, 200, await res.clone().text())
      assert.equal(await res.text(), 'plain')
    })

    test('a secure sandbox still refuses a call without its token', async () => {
      const sbx = await Sandbox.create('base', { timeoutMs: 120_000 })
      server.defer(() => sbx.kill())
      const res = await envd(sbx.sandboxId, '/files?path=/etc/hostname&username=user')
      assert.equal(res.status, 401)
    })
  })

  describe('through the SDK', () => {
    let sbx
    before(async () => {
      sbx = await Sandbox.create('base', { timeoutMs: 600_000 })
      server.defer(() => sbx.kill())
    })

    test('files under /proc are read whole (boot_id)', async () => {
      const want = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
      assert.match(want, /^[0-9a-f-]{36}\n$/)
      assert.equal(await sbx.files.read('/proc/sys/kernel/random/boot_id'), want)
      assert.equal(await sbx.files.read('/proc/sys/kernel/random/boot_id', { gzip: true }), want)
    })

    test('a command deadline ends the stream with deadline_exceeded, not an end event', async () => {
      assert.ok(sbx.envdAccessToken, 'the SDK holds no envd access token')
      const started = Date.now()
      const res = await envd(sbx.sandboxId, '/process.Process/Start', {
        method: 'POST',
        headers: {
          'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1',
          'Connect-Timeout-Ms': '1500', Authorization: 'Basic ' + Buffer.from('user:').toString('base64'),
          'X-Access-Token': sbx.envdAccessToken,
        },
        body: envelope({ process: { cmd: '/bin/bash', args: ['-c', 'sleep 30'] } }),
      })
      assert.equal(res.status, 200)
      const frames = connectFrames(Buffer.from(await res.arrayBuffer()))
      const took = Date.now() - started
      assert.ok(took >= 1400 && took < 10_000, `stream ended after ${took} ms`)
      assert.ok(frames[0].json.event?.start, `first frame ${JSON.stringify(frames[0])}`)
      assert.ok(!frames.some((f) => f.json.event?.end), 'an end event was sent after the deadline')
      const last = frames[frames.length - 1]
      assert.equal(last.flags, 2)
      assert.equal(last.json.error?.code, 'deadline_exceeded', JSON.stringify(last.json))
    })

    test("a background command's wait raises TimeoutError at its deadline", async () => {
      const handle = await sbx.commands.run('sleep 30', { background: true, timeoutMs: 1500 })
      await rejectsWith(handle.wait(), TimeoutError, 'wait past the deadline')
    })
  })
})
