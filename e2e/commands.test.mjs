// Processes through the E2B SDK: commands.run with every option, exit
// errors, timeouts, background handles (wait, kill, stdin, disconnect and
// reconnect), commands.list, and users.

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { setTimeout as sleep } from 'node:timers/promises'
import {
  Sandbox, CommandExitError, TimeoutError, NotFoundError, InvalidArgumentError, SandboxError, AuthenticationError,
} from 'e2b'
import { useServer, rejectsWith, eventually } from './harness.mjs'

describe('commands', () => {
  const server = useServer({ before, after })

  let sbx
  before(async () => {
    sbx = await Sandbox.create('base', { timeoutMs: 600_000 })
    server.defer(() => sbx.kill())
  })

  // processGone waits until no process of the sandbox matches pattern.
  async function processGone(pattern, timeoutMs = 10_000) {
    await eventually(async () => {
      // The [.] keeps pgrep from matching this very bash -c command line.
      const r = await sbx.commands.run(`pgrep -f '${pattern.replace('.', '[.]')}' || true`)
      assert.equal(r.stdout.trim(), '', `still running: ${pattern}`)
    }, { timeoutMs, intervalMs: 250 })
  }

  describe('commands.run', () => {
    test('captures stdout, stderr and exit code 0', async () => {
      const r = await sbx.commands.run('echo out; echo err >&2')
      assert.equal(r.exitCode, 0)
      assert.equal(r.stdout, 'out\n')
      assert.equal(r.stderr, 'err\n')
      assert.equal(r.error, undefined)
    })

    test('runs through bash -l -c: pipes, quoting and unicode survive', async () => {
      const r = await sbx.commands.run(`printf '%s|' "a b" 'c"d' ünï😀 | tr a-z A-Z`)
      assert.equal(r.stdout, 'A B|C"D|üNï😀|')
    })

    test('envs are set for the command', async () => {
      const r = await sbx.commands.run('echo "$FOO|$EMPTY|$SPACED"', { envs: { FOO: 'bar', EMPTY: '', SPACED: 'x y  z' } })
      assert.equal(r.stdout, 'bar||x y  z\n')
    })

    test('the standard environment is there', async () => {
      const r = await sbx.commands.run('echo "$HOME|$USER|$PATH"')
      const [home, user, pathVar] = r.stdout.trim().split('|')
      assert.equal(home, '/home/user')
      assert.equal(user, 'user')
      assert.match(pathVar, /\/usr\/bin/)
    })

    test('cwd sets the working directory', async () => {
      assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
      assert.equal((await sbx.commands.run('pwd', { cwd: '/' })).stdout, '/\n')
    })

    test('a missing cwd gives InvalidArgumentError', async () => {
      await rejectsWith(sbx.commands.run('pwd', { cwd: '/no/such/dir' }), InvalidArgumentError, 'missing cwd')
    })

    test('the default user is "user" in /home/user', async () => {
      const r = await sbx.commands.run('whoami; pwd; id -u; test -w "$HOME" && echo writable')
      assert.equal(r.stdout, 'user\n/home/user\n1000\nwritable\n')
    })

    test('user root runs as root with HOME /root', async () => {
      const r = await sbx.commands.run('whoami; id -u; echo "$HOME"; touch /root/ok && echo wrote', { user: 'root' })
      assert.equal(r.stdout, 'root\n0\n/root\nwrote\n')
    })

    test('user "user" given explicitly', async () => {
      const r = await sbx.commands.run('whoami; echo "$HOME"', { user: 'user' })
      assert.equal(r.stdout, 'user\n/home/user\n')
    })

    test('the default user cannot write where only root can', async () => {
      const err = await rejectsWith(sbx.commands.run('touch /root/nope'), CommandExitError, 'touch /root as user')
      assert.notEqual(err.exitCode, 0)
      assert.match(err.stderr, /Permission denied/)
    })

    test('an unknown user is refused with AuthenticationError', async () => {
      await rejectsWith(sbx.commands.run('true', { user: 'nosuchuser' }), AuthenticationError, 'unknown user')
    })

    test('onStdout and onStderr receive the output as it comes', async () => {
      const outs = []
      const errs = []
      const r = await sbx.commands.run('for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.1; done', {
        onStdout: (d) => { outs.push(d) },
        onStderr: (d) => { errs.push(d) },
      })
      assert.equal(outs.join(''), 'o1\no2\no3\n')
      assert.equal(errs.join(''), 'e1\ne2\ne3\n')
      assert.ok(outs.length >= 2, `stdout came in ${outs.length} chunk(s); expected streaming`)
      assert.equal(r.stdout, 'o1\no2\no3\n')
    })

    test('output is streamed before the command ends', async () => {
      let firstAt = 0
      const start = Date.now()
      await sbx.commands.run('echo first; sleep 1.5; echo second', {
        onStdout: () => { if (!firstAt) firstAt = Date.now() },
      })
      assert.ok(firstAt - start < 1200, `first output arrived after ${firstAt - start} ms`)
    })

    test('large output (8 MB) arrives intact', async () => {
      let streamed = 0
      const r = await sbx.commands.run('head -c 8000000 /dev/zero | tr "\\0" x', { onStdout: (d) => { streamed += d.length } })
      assert.equal(r.stdout.length, 8_000_000)
      assert.equal(streamed, 8_000_000)
      assert.ok(/^x+$/.test(r.stdout))
    })

    test('binary-ish and invalid UTF-8 output does not break the stream', async () => {
      const r = await sbx.commands.run("printf 'a\\xffb\\x00c\\n'")
      assert.equal(r.exitCode, 0)
      assert.equal(r.stdout.length > 0, true)
    })

    test('many concurrent commands each get their own output', async () => {
      const results = await Promise.all(Array.from({ length: 20 }, (_, i) => sbx.commands.run(`sleep 0.$((RANDOM % 3)); echo ${i}`)))
      results.forEach((r, i) => assert.equal(r.stdout, `${i}\n`))
    })
  })

  describe('CommandExitError', () => {
    test('a non-zero exit throws with exitCode, stdout, stderr and error', async () => {
      const err = await rejectsWith(sbx.commands.run('echo partial; echo oops >&2; exit 3'), CommandExitError, 'exit 3')
      assert.ok(err instanceof SandboxError)
      assert.equal(err.exitCode, 3)
      assert.equal(err.stdout, 'partial\n')
      assert.equal(err.stderr, 'oops\n')
      assert.equal(err.error, 'exit status 3')
      assert.equal(err.message, 'exit status 3')
    })

    test('an unknown command exits 127', async () => {
      const err = await rejectsWith(sbx.commands.run('no-such-command-xyz'), CommandExitError, 'unknown command')
      assert.equal(err.exitCode, 127)
      assert.match(err.stderr, /not found/)
    })

    test('a command killed by a signal is an exit error', async () => {
      const err = await rejectsWith(sbx.commands.run('kill -9 $$'), CommandExitError, 'self SIGKILL')
      assert.notEqual(err.exitCode, 0)
    })
  })

  describe('timeoutMs', () => {
    test('a command exceeding timeoutMs gives TimeoutError and is killed', async () => {
      const start = Date.now()
      await rejectsWith(sbx.commands.run('sleep 37.25', { timeoutMs: 1500 }), TimeoutError, 'sleep past timeout')
      const took = Date.now() - start
      assert.ok(took >= 1400 && took < 10_000, `timed out after ${took} ms`)
      // envd enforces Connect-Timeout-Ms as the process deadline.
      await processGone('sleep 37.25')
    })

    test('a command within timeoutMs succeeds', async () => {
      const r = await sbx.commands.run('sleep 0.3; echo done', { timeoutMs: 5000 })
      assert.equal(r.stdout, 'done\n')
    })

    test('timeoutMs 0 means no limit', async () => {
      const r = await sbx.commands.run('sleep 1; echo done', { timeoutMs: 0 })
      assert.equal(r.stdout, 'done\n')
    })
  })

  describe('background commands', () => {
    test('run in background returns a handle at once; wait gives the result', async () => {
      const start = Date.now()
      const h = await sbx.commands.run('sleep 1; echo finished', { background: true })
      assert.ok(Date.now() - start < 900, 'background run blocked')
      assert.ok(Number.isInteger(h.pid) && h.pid > 0, `pid ${h.pid}`)
      assert.equal(h.exitCode, undefined)
      const r = await h.wait()
      assert.equal(r.exitCode, 0)
      assert.equal(r.stdout, 'finished\n')
      assert.equal(h.exitCode, 0)
    })

    test('wait on a failing background command throws CommandExitError', async () => {
      const h = await sbx.commands.run('echo before; exit 7', { background: true })
      const err = await rejectsWith(h.wait(), CommandExitError, 'background exit 7')
      assert.equal(err.exitCode, 7)
      assert.equal(err.stdout, 'before\n')
    })

    test('kill ends the process; wait then throws CommandExitError', async () => {
      const h = await sbx.commands.run('sleep 41.5', { background: true })
      assert.equal(await h.kill(), true)
      const err = await rejectsWith(h.wait(), CommandExitError, 'wait after kill')
      assert.notEqual(err.exitCode, 0)
      await processGone('sleep 41.5')
    })

    test('commands.kill by pid; false for an unknown pid', async () => {
      const h = await sbx.commands.run('sleep 43.5', { background: true })
      assert.equal(await sbx.commands.kill(h.pid), true)
      await rejectsWith(h.wait(), CommandExitError, 'wait after commands.kill')
      assert.equal(await sbx.commands.kill(h.pid), false, 'kill of an ended pid')
      assert.equal(await sbx.commands.kill(999_999), false, 'kill of an unknown pid')
    })

    test('sendStdin feeds the process; closeStdin gives EOF', async () => {
      let streamed = ''
      const h = await sbx.commands.run('cat; echo "<eof>"', { background: true, stdin: true, onStdout: (d) => { streamed += d } })
      await h.sendStdin('hello\n')
      await eventually(() => assert.equal(streamed, 'hello\n'), { timeoutMs: 5000 })
      await sbx.commands.sendStdin(h.pid, new TextEncoder().encode('bytes too\n'))
      await h.closeStdin()
      const r = await h.wait()
      assert.equal(r.stdout, 'hello\nbytes too\n<eof>\n')
    })

    test('closeStdin via commands.closeStdin', async () => {
      const h = await sbx.commands.run('wc -c', { background: true, stdin: true })
      await sbx.commands.sendStdin(h.pid, 'abcde')
      await sbx.commands.closeStdin(h.pid)
      const r = await h.wait()
      assert.equal(r.stdout.trim(), '5')
    })

    test('sendStdin to an unknown pid gives NotFoundError', async () => {
      await rejectsWith(sbx.commands.sendStdin(999_999, 'x'), NotFoundError, 'sendStdin unknown pid')
    })

    test('disconnect leaves the process running; commands.connect(pid) picks it up', async () => {
      let before = ''
      const h = await sbx.commands.run('for i in $(seq 1 40); do echo tick$i; sleep 0.1; done; echo over', {
        background: true, onStdout: (d) => { before += d },
      })
      await eventually(() => assert.match(before, /tick2\n/), { timeoutMs: 5000 })
      await h.disconnect()
      const seenAtDisconnect = before
      await sleep(500)
      assert.equal(before, seenAtDisconnect, 'output arrived after disconnect')

      const listed = await sbx.commands.list()
      assert.ok(listed.some((p) => p.pid === h.pid), 'disconnected process not listed')

      let after = ''
      const again = await sbx.commands.connect(h.pid, { onStdout: (d) => { after += d } })
      assert.equal(again.pid, h.pid)
      const r = await again.wait()
      assert.equal(r.exitCode, 0)
      assert.match(after, /over\n$/)
      // Connect does not replay output produced before it.
      assert.ok(!after.includes('tick1\n'), 'connect replayed old output')
    })

    test('kill through a reconnected handle', async () => {
      const h = await sbx.commands.run('sleep 47.5', { background: true })
      await h.disconnect()
      const again = await sbx.commands.connect(h.pid)
      assert.equal(await again.kill(), true)
      await rejectsWith(again.wait(), CommandExitError, 'wait after kill via connect')
    })

    test('commands.connect to an unknown pid gives NotFoundError', async () => {
      await rejectsWith(sbx.commands.connect(999_999), NotFoundError, 'connect unknown pid')
    })
  })

  describe('commands.list', () => {
    test('lists running commands with their config', async () => {
      const h = await sbx.commands.run('sleep 53.5', { background: true, envs: { LISTED: 'yes' }, cwd: '/tmp' })
      try {
        const list = await sbx.commands.list()
        const p = list.find((x) => x.pid === h.pid)
        assert.ok(p, `pid ${h.pid} not in ${JSON.stringify(list)}`)
        assert.equal(p.cmd, '/bin/bash')
        assert.deepEqual(p.args, ['-l', '-c', 'sleep 53.5'])
        assert.equal(p.envs.LISTED, 'yes')
        assert.equal(p.cwd, '/tmp')
      } finally {
        await h.kill()
      }
      await eventually(async () => {
        const list = await sbx.commands.list()
        assert.ok(!list.some((x) => x.pid === h.pid), 'killed process still listed')
      })
    })
  })
})
