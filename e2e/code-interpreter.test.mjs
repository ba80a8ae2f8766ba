// E2B's Code Interpreter SDK (@e2b/code-interpreter, pinned in
// package-lock.json), unmodified, against a real server: its default
// template (code-interpreter-v1, built on first use like base and cached in
// the template cache), state across runCode calls, streamed output, rich
// results (matplotlib PNG or SVG with the chart's data, DataFrame HTML),
// errors, timeouts that interrupt and keep state, and contexts.

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, NotFoundError, TimeoutError } from '@e2b/code-interpreter'
import { useServer, rejectsWith } from './harness.mjs'

// The first run on a machine builds the template (Debian packages, minutes);
// later runs find it in the template cache. A create that times out leaves
// the build going, so the first create is retried until it is done.
const firstCreateMs = 30 * 60_000

// createTimedOut tells whether a create failed only for taking long: the
// SDK's TimeoutError, or what a create waiting for the build meets first
// (the SDK's create does not end at its requestTimeoutMs): the HTTP
// client's limit on waiting for an answer's headers, 5 minutes, which the
// SDK passes on as a fetch failure.
function createTimedOut(err) {
  return err instanceof TimeoutError || err?.cause?.code === 'UND_ERR_HEADERS_TIMEOUT'
}

async function createFirst() {
  const deadline = Date.now() + firstCreateMs
  for (let attempt = 1; ; attempt++) {
    const began = Date.now()
    try {
      const sbx = await Sandbox.create()
      console.error(`first create: ${Date.now() - began} ms (attempt ${attempt})`)
      return sbx
    } catch (err) {
      if (!createTimedOut(err) || Date.now() > deadline) throw err
      console.error(`first create: attempt ${attempt} gave up after ${Date.now() - began} ms (template building): ${err.message}`)
    }
  }
}

// noRequestTimer is for a runCode that fails: the SDK leaves the timer of
// its requestTimeoutMs running when the answer is an error, which would keep
// node alive for a minute after the last test (0: no such timer).
const noRequestTimer = { requestTimeoutMs: 0 }

// pngSize reads the width and height from a PNG's IHDR chunk.
function pngSize(b64) {
  const buf = Buffer.from(b64, 'base64')
  assert.equal(buf.subarray(0, 8).toString('hex'), '89504e470d0a1a0a', 'PNG signature')
  assert.equal(buf.subarray(12, 16).toString('latin1'), 'IHDR')
  return { width: buf.readUInt32BE(16), height: buf.readUInt32BE(20) }
}

describe('code interpreter SDK', () => {
  const server = useServer({ before, after })
  let sbx

  before(async () => {
    sbx = await createFirst()
    server.defer(() => sbx.kill())
  }, { timeout: firstCreateMs + 60_000 })

  test('the first runCode after create (its time is logged)', async () => {
    const began = Date.now()
    const exec = await sbx.runCode('1 + 1')
    assert.equal(exec.text, '2')
    assert.equal(exec.error, undefined)
    console.error(`first runCode after create: ${Date.now() - began} ms`)
  })

  test('state is kept across runCode calls', async () => {
    await sbx.runCode('x = 40')
    const exec = await sbx.runCode('x + 2')
    assert.equal(exec.text, '42')
    assert.ok(exec.executionCount > 1, `executionCount ${exec.executionCount}`)
  })

  test('stdout and stderr are streamed to the callbacks', async () => {
    const out = []
    const err = []
    const exec = await sbx.runCode(
      'import sys\nprint("out-1")\nprint("err-1", file=sys.stderr)\nprint("out-2")',
      { onStdout: (m) => out.push(m.line), onStderr: (m) => err.push(m.line) })
    assert.equal(out.join(''), 'out-1\nout-2\n')
    assert.equal(err.join(''), 'err-1\n')
    assert.deepEqual(exec.logs.stdout, out)
    assert.deepEqual(exec.logs.stderr, err)
    assert.equal(exec.results.length, 0)
  })

  test('an exception comes back as name, value and traceback', async () => {
    const seen = []
    const exec = await sbx.runCode('def f():\n    raise ValueError("bad value")\nf()', { onError: (e) => seen.push(e) })
    assert.equal(exec.error.name, 'ValueError')
    assert.equal(exec.error.value, 'bad value')
    assert.match(exec.error.traceback, /ValueError/)
    assert.match(exec.error.traceback, /raise ValueError/)
    assert.equal(seen.length, 1)
    // The kernel goes on.
    assert.equal((await sbx.runCode('x')).text, '40')
  })

  test('a matplotlib figure is a PNG of the figure size', async () => {
    const exec = await sbx.runCode([
      'import matplotlib.pyplot as plt',
      'fig = plt.figure(figsize=(4, 3), dpi=100)',
      'plt.plot([1, 2, 3], [3, 1, 2])',
      'plt.show()',
    ].join('\n'))
    assert.equal(exec.error, undefined, exec.error?.traceback)
    const images = exec.results.filter((r) => r.png)
    assert.equal(images.length, 1)
    assert.deepEqual(pngSize(images[0].png), { width: 400, height: 300 })
    assert.match(images[0].text, /Figure size 400x300/)
    assert.equal(images[0].isMainResult, false)
    // Figures left open at the end of a cell are shown too.
    const again = await sbx.runCode('plt.figure(figsize=(2, 1), dpi=50); plt.bar([1, 2], [3, 4]);')
    const more = again.results.filter((r) => r.png)
    assert.equal(more.length, 1)
    assert.deepEqual(pngSize(more[0].png), { width: 100, height: 50 })
  })

  test('a DataFrame is HTML and text, display() adds results', async () => {
    const exec = await sbx.runCode([
      'import pandas as pd',
      'df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})',
      'display("shown first")',
      'df',
    ].join('\n'))
    assert.equal(exec.error, undefined, exec.error?.traceback)
    assert.equal(exec.results.length, 2)
    assert.equal(exec.results[0].text, "'shown first'")
    assert.equal(exec.results[0].isMainResult, false)
    const main = exec.results[1]
    assert.equal(main.isMainResult, true)
    assert.match(main.html, /<table/)
    assert.match(main.html, /<th>a<\/th>/)
    assert.match(main.text, /a\s+b/)
    assert.deepEqual(main.formats(), ['html'])
  })

  test('envs are seen by the code, for that execution only', async () => {
    const exec = await sbx.runCode('import os; os.environ["CI_E2E_VAR"]', { envs: { CI_E2E_VAR: 'v1' } })
    assert.equal(exec.text, "'v1'")
    assert.equal((await sbx.runCode('os.environ.get("CI_E2E_VAR")')).text, undefined)
  })

  test('a timeout interrupts the cell and keeps the state', async () => {
    await sbx.runCode('y = 7')
    await rejectsWith(
      sbx.runCode('import time\ny = 8\ntime.sleep(60)\ny = 9', { timeoutMs: 1500 }),
      TimeoutError, 'runCode past its timeoutMs')
    // Not stuck behind the 60 s sleep: the cell was interrupted.
    const began = Date.now()
    const exec = await sbx.runCode('y', { timeoutMs: 30_000 })
    assert.equal(exec.text, '8')
    assert.ok(Date.now() - began < 30_000)
  })

  test('contexts: create, list, use, restart, remove', async () => {
    const ctx = await sbx.createCodeContext({ cwd: '/tmp', language: 'python' })
    assert.equal(ctx.language, 'python')
    assert.equal(ctx.cwd, '/tmp')
    assert.ok(ctx.id)
    assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, "'/tmp'")
    // Its own state: the default context's x is not there.
    const missing = await sbx.runCode('x', { context: ctx })
    assert.equal(missing.error.name, 'NameError')
    await sbx.runCode('z = 5', { context: ctx })
    assert.equal((await sbx.runCode('z', { context: ctx })).text, '5')

    const ids = (await sbx.listCodeContexts()).map((c) => c.id)
    assert.ok(ids.includes(ctx.id), `list ${ids}`)
    assert.ok(ids.length >= 2, 'the default context is listed too')

    await sbx.restartCodeContext(ctx)
    assert.equal((await sbx.runCode('z', { context: ctx })).error.name, 'NameError')

    await sbx.removeCodeContext(ctx.id)
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
    await rejectsWith(sbx.runCode('1', { context: ctx, ...noRequestTimer }), NotFoundError, 'runCode in a removed context')
    // The default context is untouched.
    assert.equal((await sbx.runCode('x')).text, '40')
  })

  test('an unknown context is the SDK\'s NotFoundError', async () => {
    const err = await rejectsWith(sbx.runCode('1', { context: { id: 'no-such-context', language: 'python', cwd: '/' },
      ...noRequestTimer }),
      NotFoundError, 'runCode in an unknown context')
    assert.match(err.message, /no-such-context/)
    await rejectsWith(sbx.removeCodeContext('no-such-context'), NotFoundError, 'remove an unknown context')
  })

  test('the short alias code-interpreter is the same template', async () => {
    const other = await Sandbox.create('code-interpreter')
    try {
      assert.equal((await other.runCode('import numpy; int(numpy.arange(4).sum())')).text, '6')
    } finally {
      await other.kill()
    }
  })

  test('a figure comes with its chart: lines, bars, dates', async () => {
    const exec = await sbx.runCode([
      'import matplotlib.pyplot as plt',
      'import pandas as pd',
      'plt.plot([1, 2, 3], [1, 4, 9], label="squares")',
      'plt.plot([1, 2, 3], [1, 8, 27], label="cubes")',
      'plt.title("Powers"); plt.xlabel("Distance (m)"); plt.legend()',
      'plt.show()',
      'plt.bar(["Author A", "Author B"], [100, 200], label="Books Sold")',
      'plt.title("Book Sales"); plt.ylabel("Number of Books Sold")',
      'plt.show()',
      'plt.plot(pd.date_range("2024-01-01", periods=3), [5, 6, 7]);',
    ].join('\n'))
    assert.equal(exec.error, undefined, exec.error?.traceback)
    assert.equal(exec.results.length, 3)
    for (const r of exec.results) {
      assert.deepEqual(r.formats(), ['png'], 'the chart is no format of its own')
      assert.equal(r.isMainResult, false)
    }
    const [line, bar, dates] = exec.results.map((r) => r.chart)
    assert.equal(line.type, 'line')
    assert.equal(line.title, 'Powers')
    assert.equal(line.x_label, 'Distance (m)')
    assert.equal(line.x_unit, 'm')
    assert.equal(line.y_label, null)
    assert.equal(line.x_scale, 'linear')
    assert.equal(line.x_ticks.length, line.x_tick_labels.length)
    assert.deepEqual(line.elements, [
      { label: 'squares', points: [[1, 1], [2, 4], [3, 9]] },
      { label: 'cubes', points: [[1, 1], [2, 8], [3, 27]] },
    ])
    assert.equal(bar.type, 'bar')
    assert.equal(bar.title, 'Book Sales')
    assert.equal(bar.y_label, 'Number of Books Sold')
    assert.deepEqual(bar.elements, [
      { label: 'Author A', group: 'Books Sold', value: 100 },
      { label: 'Author B', group: 'Books Sold', value: 200 },
    ])
    assert.equal(dates.type, 'line')
    assert.equal(dates.x_scale, 'datetime')
    assert.deepEqual(dates.elements[0].points,
      [['2024-01-01T00:00:00', 5], ['2024-01-02T00:00:00', 6], ['2024-01-03T00:00:00', 7]])
    assert.ok(dates.x_ticks.every((t) => !Number.isNaN(Date.parse(t))), `x_ticks ${dates.x_ticks}`)
  })

  test('figures as SVG when asked, as in Jupyter', async () => {
    const ctx = await sbx.createCodeContext()
    try {
      const plot = 'import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4]); plt.title("Two points"); plt.show()'
      const svg = await sbx.runCode("%config InlineBackend.figure_formats = ['svg']\n" + plot, { context: ctx })
      assert.equal(svg.error, undefined, svg.error?.traceback)
      assert.equal(svg.results.length, 1)
      assert.deepEqual(svg.results[0].formats(), ['svg'])
      assert.match(svg.results[0].svg, /^<\?xml[\s\S]*<svg/)
      assert.equal(svg.results[0].chart.title, 'Two points')
      // The figure as the cell's value, in both formats.
      const both = await sbx.runCode(
        "%config InlineBackend.figure_formats = ['svg', 'png']\nfig, ax = plt.subplots(); ax.plot([1, 2]); fig",
        { context: ctx })
      assert.equal(both.results.length, 1)
      assert.equal(both.results[0].isMainResult, true)
      assert.deepEqual(both.results[0].formats(), ['svg', 'png'])
      assert.equal(both.results[0].chart.type, 'line')
      // The default context keeps PNG.
      const png = await sbx.runCode(plot)
      assert.deepEqual(png.results.map((r) => r.formats()), [['png']])
    } finally {
      await sbx.removeCodeContext(ctx.id)
    }
  })

  test('bash: one shell per context keeps its state; a failing cell is its exit status', async () => {
    const first = await sbx.runCode('cd /tmp && GREETING=hello && greet() { echo "$GREETING $1"; }', { language: 'bash' })
    assert.equal(first.error, undefined)
    const second = await sbx.runCode('greet world; pwd', { language: 'bash' })
    assert.equal(second.logs.stdout.join(''), 'hello world\n/tmp\n')
    const failed = await sbx.runCode('ls /no/such/dir', { language: 'bash' })
    assert.equal(failed.error?.value, '2')
    assert.match(failed.logs.stderr.join(''), /No such file/)
    // Python's default context is another one.
    assert.equal((await sbx.runCode('import os; os.getcwd() != "/tmp"')).text, 'True')
    const ctx = await sbx.createCodeContext({ language: 'bash' })
    assert.equal(ctx.language, 'bash')
    const own = await sbx.runCode('echo "[${GREETING-}]"', { context: ctx })
    assert.equal(own.logs.stdout.join(''), '[]\n')
    await sbx.removeCodeContext(ctx.id)
  })

  test('a new sandbox\'s first run finds its envs and a warm kernel', async () => {
    const other = await Sandbox.create({ envs: { FROM_CREATE: 'yes' } })
    server.defer(() => other.kill())
    const exec = await other.runCode("import os, sys\nos.environ.get('FROM_CREATE'), 'pandas' in sys.modules")
    assert.equal(exec.text, "('yes', True)")
    assert.equal(exec.executionCount, 1)
  })

  test('the kernel\'s state survives pause and resume, and is copied to forks', async () => {
    const src = await Sandbox.create()
    server.defer(() => src.kill())
    await src.runCode('x = 123\nimport numpy as np\na = np.arange(5)')
    await src.pause()
    const resumed = await Sandbox.connect(src.sandboxId)
    assert.equal((await resumed.runCode('x, int(a.sum())')).text, '(123, 10)')
    const children = await resumed.fork({ count: 2 })
    for (const c of children) server.defer(() => c.kill())
    assert.equal(children.length, 2)
    await children[0].runCode('x = 1')
    assert.equal((await children[0].runCode('x')).text, '1')
    assert.equal((await children[1].runCode('x, int(a.sum())')).text, '(123, 10)')
    assert.equal((await resumed.runCode('x')).text, '123')
  })
})
