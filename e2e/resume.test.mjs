// E2B's lifecycle options through the SDK: lifecycle.autoResume (traffic to
// a paused sandbox resumes it, once, however many requests arrive), and
// onTimeout {action: 'pause', keepMemory: false} (the deadline pauses it
// without its memory: connect brings back the files, not the processes).

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { useServer, eventually } from './harness.mjs'

describe('lifecycle options', () => {
  const server = useServer({ before, after })

  test('autoResume: commands and files resume a paused sandbox, memory intact', async () => {
    const sbx = await Sandbox.create('base', { timeoutMs: 300_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
    server.defer(() => sbx.kill().catch(() => {}))
    assert.equal((await sbx.getInfo()).lifecycle?.autoResume, true)
    const h = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
    await h.disconnect()
    await sbx.files.write('/tmp/kept', 'yes')
    await sbx.pause()
    assert.equal((await sbx.getInfo()).state, 'paused')

    // Several requests at once: each is served, the sandbox resumes once.
    const [a, b, c] = await Promise.all([
      sbx.commands.run('cat /tmp/kept'),
      sbx.files.read('/tmp/kept'),
      sbx.commands.run(`kill -0 ${h.pid} && echo alive`),
    ])
    assert.equal(a.stdout, 'yes')
    assert.equal(b, 'yes')
    assert.equal(c.stdout, 'alive\n')
    assert.equal((await sbx.getInfo()).state, 'running')
  })

  test('without autoResume traffic to a paused sandbox does not resume it', async () => {
    const sbx = await Sandbox.create('base', { timeoutMs: 300_000, lifecycle: { onTimeout: 'pause' } })
    server.defer(() => sbx.kill().catch(() => {}))
    await sbx.pause()
    await assert.rejects(sbx.commands.run('true'))
    assert.equal((await sbx.getInfo()).state, 'paused')
  })

  test("onTimeout pause with keepMemory false: a fresh boot over the files (/tmp included)", async () => {
    const sbx = await Sandbox.create('base', {
      timeoutMs: 4_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } },
    })
    server.defer(() => sbx.kill().catch(() => {}))
    const h = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
    await h.disconnect()
    await sbx.commands.run('echo disk > /home/user/kept; echo tmp > /tmp/kept; echo shm > /dev/shm/gone')
    const bootBefore = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
    await eventually(async () => assert.equal((await sbx.getInfo()).state, 'paused'), { timeoutMs: 60_000, intervalMs: 500 })
    await sbx.connect({ timeoutMs: 60_000 })
    assert.equal((await sbx.commands.run('cat /home/user/kept /tmp/kept')).stdout, 'disk\ntmp\n')
    // A fresh boot: a new kernel, so a new boot id.
    const bootAfter = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
    assert.notEqual(bootAfter, bootBefore, 'same boot id after the resume: not a fresh boot')
    assert.equal((await sbx.commands.run('ls /dev/shm')).stdout, '')
    assert.equal((await sbx.commands.run('pgrep -x sleep || echo none')).stdout, 'none\n')
  })
})
