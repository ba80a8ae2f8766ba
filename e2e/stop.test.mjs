// Commands in flight end at once when their sandbox goes away (killed or
// paused), and the SDK reports why, as it does against E2B: the stream is
// cut, the SDK probes the sandbox's health and finds it gone.

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { useServer } from './harness.mjs'

describe('calls in flight when the sandbox stops', () => {
  const server = useServer({ before, after })

  // waitEnds runs h.wait() and returns the error it rejected with and how
  // long after stop() it took.
  async function waitEnds(h, stop) {
    const waited = h.wait().then(() => null, (err) => err)
    const started = Date.now()
    await stop()
    const err = await waited
    return { err, ms: Date.now() - started }
  }

  for (const timeoutMs of [undefined, 0]) {
    test(`kill ends a background command (timeoutMs ${timeoutMs})`, async () => {
      const sbx = await Sandbox.create('base', { timeoutMs: 300_000 })
      server.defer(() => sbx.kill().catch(() => {}))
      const h = await sbx.commands.run('sleep 120', { background: true, timeoutMs })
      const { err, ms } = await waitEnds(h, () => sbx.kill())
      assert.ok(err, 'wait() resolved although the sandbox was killed')
      assert.match(err.message, /killed|not running|not found/i)
      assert.ok(ms < 10_000, `wait() ended ${ms} ms after the kill`)
    })
  }

  test('pause ends a foreground command', async () => {
    const sbx = await Sandbox.create('base', { timeoutMs: 300_000 })
    server.defer(() => sbx.kill().catch(() => {}))
    const h = await sbx.commands.run('sleep 120', { background: true })
    const { err, ms } = await waitEnds(h, () => sbx.pause())
    assert.ok(err, 'wait() resolved although the sandbox was paused')
    assert.ok(ms < 10_000, `wait() ended ${ms} ms after the pause`)
    // The sandbox itself is intact: it resumes and runs commands.
    await sbx.connect()
    assert.equal((await sbx.commands.run('echo back')).stdout, 'back\n')
  })
})
