// Terminals through the E2B SDK: pty.create is a real interactive bash
// that echoes, reports its size (and a new one after resize), is
// interrupted by Ctrl-C, and can be killed.

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError } from 'e2b'
import { useServer, rejectsWith, eventually } from './harness.mjs'

const enc = new TextEncoder()

// terminal wraps a PTY handle with its accumulated output.
async function openTerminal(sbx, opts = {}) {
  const term = { out: '' }
  const decoder = new TextDecoder()
  term.handle = await sbx.pty.create({
    cols: 80, rows: 24, ...opts,
    onData: (d) => {
      assert.ok(d instanceof Uint8Array, 'onData must receive a Uint8Array')
      term.out += decoder.decode(d, { stream: true })
    },
  })
  term.send = (text) => sbx.pty.sendInput(term.handle.pid, enc.encode(text))
  // waitFor waits until the output after `from` matches re.
  term.waitFor = (re, from = 0, timeoutMs = 10_000) =>
    eventually(() => assert.match(term.out.slice(from), re), { timeoutMs, intervalMs: 50 })
  return term
}

describe('pty', () => {
  const server = useServer({ before, after })

  let sbx
  before(async () => {
    sbx = await Sandbox.create('base', { timeoutMs: 300_000 })
    server.defer(() => sbx.kill())
  })

  test('an interactive bash that echoes input and runs commands', async () => {
    const t = await openTerminal(sbx)
    try {
      assert.ok(t.handle.pid > 0)
      // The marker is split so that the echoed input cannot match it.
      await t.send('echo "mark""er-$((6*7))"\n')
      await t.waitFor(/marker-42/)
      // Echo of typed input: the terminal shows what was typed.
      assert.match(t.out, /echo "mark""er-\$\(\(6\*7\)\)"/)
      await t.send('tty; echo "$TERM"\n')
      await t.waitFor(/\/dev\/pts\/\d+[\s\S]*xterm-256color/)
    } finally {
      await sbx.pty.kill(t.handle.pid)
    }
  })

  test('it runs as the default user in its home; root on request', async () => {
    const t = await openTerminal(sbx)
    await t.send('echo "who=$(whoami) dir=$(pwd)"; exit\n')
    await t.handle.wait()
    assert.match(t.out, /who=user dir=\/home\/user/)

    const r = await openTerminal(sbx, { user: 'root', cwd: '/tmp', envs: { PTYVAR: 'set' } })
    await r.send('echo "who=$(whoami) dir=$(pwd) var=$PTYVAR"; exit\n')
    await r.handle.wait()
    assert.match(r.out, /who=root dir=\/tmp var=set/)
  })

  test('stty size reports the size given at create and after resize', async () => {
    const t = await openTerminal(sbx, { cols: 91, rows: 27 })
    try {
      await t.send('stty size\n')
      await t.waitFor(/^27 91\r?$/m)
      await sbx.pty.resize(t.handle.pid, { cols: 133, rows: 41 })
      const mark = t.out.length
      await t.send('stty size\n')
      await t.waitFor(/^41 133\r?$/m, mark)
    } finally {
      await sbx.pty.kill(t.handle.pid)
    }
  })

  test('Ctrl-C interrupts a running sleep and the shell carries on', async () => {
    const t = await openTerminal(sbx)
    try {
      await t.send('sleep 61.5; echo "slept""-through"\n')
      await eventually(async () => {
        const r = await sbx.commands.run("pgrep -f 'sleep 61[.]5' || true")
        assert.notEqual(r.stdout.trim(), '', 'sleep not started yet')
      })
      const start = Date.now()
      await t.send('\x03')
      await eventually(async () => {
        const r = await sbx.commands.run("pgrep -f 'sleep 61[.]5' || true")
        assert.equal(r.stdout.trim(), '', 'sleep survived Ctrl-C')
      }, { timeoutMs: 5000 })
      assert.ok(Date.now() - start < 5000)
      const mark = t.out.length
      await t.send('echo "after""-interrupt $?"\n')
      await t.waitFor(/after-interrupt 130/, mark)
      assert.ok(!t.out.includes('slept-through'), 'the command after sleep ran: Ctrl-C did not interrupt the line')
    } finally {
      await sbx.pty.kill(t.handle.pid)
    }
  })

  test('Ctrl-D (EOF) ends the shell with exit code 0', async () => {
    const t = await openTerminal(sbx, { timeoutMs: 20_000 })
    // Wait for the shell to be at its prompt: readline flushes input typed
    // before it switches the terminal to raw mode.
    await t.send('echo "rea""dy"\n')
    await t.waitFor(/ready/)
    await new Promise((resolve) => setTimeout(resolve, 200))
    await t.send('\x04')
    const r = await t.handle.wait()
    assert.equal(r.exitCode, 0)
  })

  test('exit with a code ends wait with CommandExitError', async () => {
    const t = await openTerminal(sbx, { timeoutMs: 20_000 })
    await t.send('exit 5\n')
    const err = await rejectsWith(t.handle.wait(), CommandExitError, 'exit 5')
    assert.equal(err.exitCode, 5)
  })

  test('kill ends the terminal; wait throws; kill of an unknown pid is false', async () => {
    const t = await openTerminal(sbx)
    await t.send('echo "al""ive"\n')
    await t.waitFor(/alive/)
    assert.equal(await sbx.pty.kill(t.handle.pid), true)
    await rejectsWith(t.handle.wait(), CommandExitError, 'wait after pty.kill')
    assert.equal(await sbx.pty.kill(t.handle.pid), false, 'second kill')
    assert.equal(await sbx.pty.kill(999_999), false, 'unknown pid')
  })

  test('a terminal is listed and can be reconnected with pty.connect', async () => {
    const t = await openTerminal(sbx)
    try {
      const listed = await sbx.commands.list()
      assert.ok(listed.some((p) => p.pid === t.handle.pid), 'pty not in commands.list')
      await t.handle.disconnect()
      let out = ''
      const decoder = new TextDecoder()
      const again = await sbx.pty.connect(t.handle.pid, { onData: (d) => { out += decoder.decode(d, { stream: true }) } })
      await sbx.pty.sendInput(again.pid, enc.encode('echo "re""connected"\n'))
      await eventually(() => assert.match(out, /reconnected/))
    } finally {
      await sbx.pty.kill(t.handle.pid)
    }
  })

  test('pty output carries raw bytes (colours, UTF-8)', async () => {
    const t = await openTerminal(sbx)
    try {
      await t.send("printf '\\033[31mred\\033[0m ünï\\n'\n")
      await t.waitFor(/\x1b\[31mred\x1b\[0m ünï/)
    } finally {
      await sbx.pty.kill(t.handle.pid)
    }
  })
})
