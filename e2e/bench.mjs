// Benchmark of aenv through the unmodified E2B SDK (e2b@2.51.0), against a
// real `aenv server` started by the e2e harness (needs root and bin/).
//
//   node bench.mjs                 # full run (500 round trips, ...)
//   node bench.mjs --short         # quick run (50 round trips, ...)
//   node bench.mjs --runs 1000 --json out.json
//
// Figures, each as p50/p99/min/max/avg in milliseconds:
//   - commands.run('true') round trip
//   - time to first byte of a commands.run stream (onStdout)
//   - 50 concurrent commands.run streams: wall time and per command
//   - files.write + files.read of 1 KB and of 10 MB
//   - Sandbox.create + first command
// and a profile of where the time of commands.run('true') goes: the same
// process through the SDK, through a bare Connect request to the server's
// envd proxy, straight to envd (bypassing the proxy), through the seed's
// POST /sandboxes/{id}/execute (curl), and `bash -l -c true` vs
// `bash -c true` vs `/bin/true` timed inside the sandbox.
//
// Every phase is bounded by a count and a time budget; every sandbox the
// benchmark makes is killed, and the harness stops the server.

import { execFile } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import fs from 'node:fs'
import os from 'node:os'
import { performance } from 'node:perf_hooks'
import { promisify } from 'node:util'
import { Sandbox } from 'e2b'
import { AenvServer } from './harness.mjs'

const execFileAsync = promisify(execFile)

function parseArgs(argv) {
  const opts = { short: false, runs: null, json: null, phaseBudgetMs: 180_000 }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    if (a === '--short') opts.short = true
    else if (a === '--runs') opts.runs = Number(argv[++i])
    else if (a === '--json') opts.json = argv[++i]
    else if (a === '--phase-budget-s') opts.phaseBudgetMs = Number(argv[++i]) * 1000
    else if (a === '-h' || a === '--help') {
      console.log('usage: node bench.mjs [--short] [--runs N] [--json FILE] [--phase-budget-s S]')
      process.exit(0)
    } else throw new Error(`unknown argument ${a}`)
  }
  const s = opts.short
  opts.counts = {
    rtt: opts.runs ?? (s ? 50 : 500),
    warmup: s ? 5 : 20,
    ttfb: s ? 10 : 50,
    concurrency: 50,
    concurrentRounds: s ? 2 : 5,
    small: s ? 20 : 100,
    large: s ? 3 : 10,
    create: s ? 3 : 10,
    profile: s ? 50 : 200,
    inside: s ? 20 : 100,
  }
  if (!Number.isInteger(opts.counts.rtt) || opts.counts.rtt < 1) throw new Error('--runs wants a positive integer')
  return opts
}

// summarize gives nearest-rank percentiles of samples in milliseconds.
function summarize(samples) {
  const s = [...samples].sort((a, b) => a - b)
  const pct = (p) => s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]
  const sum = s.reduce((a, b) => a + b, 0)
  return { n: s.length, p50: pct(50), p99: pct(99), min: s[0], max: s[s.length - 1], avg: sum / s.length }
}

// Phase runs body repeatedly, at most count times and within budgetMs, and
// returns the samples it collected (fewer when the budget ran out).
async function repeat(count, budgetMs, body) {
  const samples = []
  const deadline = Date.now() + budgetMs
  for (let i = 0; i < count && Date.now() < deadline; i++) {
    samples.push(await body(i))
  }
  return samples
}

async function timed(fn) {
  const t0 = performance.now()
  await fn()
  return performance.now() - t0
}

class Results {
  constructor() {
    this.rows = []
  }

  add(group, name, samples, note = '') {
    if (samples.length === 0) {
      this.rows.push({ group, name, n: 0, note: note || 'no samples' })
      return
    }
    this.rows.push({ group, name, ...summarize(samples), note })
  }

  print() {
    const header = ['figure', 'n', 'p50', 'p99', 'min', 'max', 'avg']
    const fmt = (v) => (v === undefined ? '-' : v.toFixed(2))
    const lines = [header]
    let group = null
    const groupRows = []
    for (const r of this.rows) {
      if (r.group !== group) {
        group = r.group
        groupRows.push(lines.length)
        lines.push([`[${group}]`, '', '', '', '', '', ''])
      }
      lines.push([`  ${r.name}`, String(r.n), fmt(r.p50), fmt(r.p99), fmt(r.min), fmt(r.max), fmt(r.avg)])
    }
    const widths = header.map((_, c) => Math.max(...lines.map((l) => l[c].length)))
    const out = lines.map((l, i) => (groupRows.includes(i) ? l[0] : l.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]) : cell.padStart(widths[c]))).join('  ')))
    out.splice(1, 0, widths.map((w) => '-'.repeat(w)).join('  '))
    console.log('\nall times in milliseconds\n' + out.join('\n'))
    const notes = this.rows.filter((r) => r.note)
    if (notes.length) console.log('\nnotes:\n' + notes.map((r) => `  ${r.group} / ${r.name}: ${r.note}`).join('\n'))
  }
}

// connectEnvelope frames one Connect streaming message (flags 0, JSON).
function connectEnvelope(obj) {
  const body = Buffer.from(JSON.stringify(obj))
  const head = Buffer.alloc(5)
  head.writeUInt32BE(body.length, 1)
  return Buffer.concat([head, body])
}

// rawStart runs cmd/args through envd's process.Process/Start with a bare
// fetch (no SDK) and returns once the stream has ended.
async function rawStart(baseUrl, sbx, cmd, args) {
  const res = await fetch(`${baseUrl}/process.Process/Start`, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/connect+json',
      'Connect-Protocol-Version': '1',
      'E2b-Sandbox-Id': sbx.sandboxId,
      'E2b-Sandbox-Port': '49983',
      ...(sbx.envdAccessToken ? { 'X-Access-Token': sbx.envdAccessToken } : {}),
    },
    body: connectEnvelope({ process: { cmd, args }, stdin: false }),
  })
  const buf = Buffer.from(await res.arrayBuffer())
  if (res.status !== 200) throw new Error(`Start ${cmd}: HTTP ${res.status}: ${buf.toString()}`)
  // The last frame is the end-of-stream (flag 0x02); an error would be in it.
  let off = 0
  let sawExit = false
  while (off + 5 <= buf.length) {
    const flags = buf[off]
    const len = buf.readUInt32BE(off + 1)
    const msg = buf.subarray(off + 5, off + 5 + len).toString()
    if (flags & 0x02) {
      if (msg !== '{}' && msg.includes('"error"')) throw new Error(`Start ${cmd}: ${msg}`)
    } else if (msg.includes('"end"')) {
      sawExit = true
    }
    off += 5 + len
  }
  if (!sawExit) throw new Error(`Start ${cmd}: stream ended without an end event`)
}

async function main() {
  const opts = parseArgs(process.argv.slice(2))
  const c = opts.counts
  const budget = opts.phaseBudgetMs
  const results = new Results()
  const extra = {}
  const server = new AenvServer()
  const made = new Set()
  const track = (sbx) => { made.add(sbx); return sbx }

  let stopping = false
  const cleanup = async () => {
    if (stopping) return
    stopping = true
    await Promise.all([...made].map((s) => s.kill().catch((err) => console.error(`kill ${s.sandboxId}: ${err.message}`))))
    const leaks = await server.stop()
    if (leaks.length) {
      console.error('aenv server left things behind:\n' + leaks.join('\n'))
      process.exitCode = 1
    }
  }
  for (const sig of ['SIGINT', 'SIGTERM']) {
    process.once(sig, () => { cleanup().finally(() => process.exit(130)) })
  }

  try {
    // Other work on the machine skews every figure: record the load.
    extra.loadAvgStart = os.loadavg()
    const t0 = performance.now()
    await server.start()
    console.error(`server up in ${((performance.now() - t0) / 1000).toFixed(1)} s at ${server.url}`)
    const sbx = track(await Sandbox.create('base', { timeoutMs: 1_800_000 }))
    console.error(`sandbox ${sbx.sandboxId}; warming up`)
    for (let i = 0; i < c.warmup; i++) await sbx.commands.run('true')

    console.error(`commands.run('true') x${c.rtt}`)
    results.add('commands', "run('true') round trip", await repeat(c.rtt, budget, () => timed(() => sbx.commands.run('true'))))

    console.error(`time to first byte x${c.ttfb}`)
    const ttfb = []
    const ttfbTotal = await repeat(c.ttfb, budget, async () => {
      const start = performance.now()
      let first = null
      await sbx.commands.run('echo x; sleep 0.2', { onStdout: () => { first ??= performance.now() } })
      if (first === null) throw new Error('no stdout from echo x')
      ttfb.push(first - start)
      return performance.now() - start
    })
    results.add('commands', "stream first stdout ('echo x; sleep 0.2')", ttfb)
    results.add('commands', "stream total ('echo x; sleep 0.2')", ttfbTotal)

    console.error(`${c.concurrency} concurrent streams x${c.concurrentRounds}`)
    const perCommand = []
    const wall = await repeat(c.concurrentRounds, budget, () => timed(() => Promise.all(
      Array.from({ length: c.concurrency }, async (_, i) => {
        const t = performance.now()
        const r = await sbx.commands.run(`echo ${i}`)
        perCommand.push(performance.now() - t)
        if (r.stdout !== `${i}\n`) throw new Error(`concurrent command ${i} printed ${JSON.stringify(r.stdout)}`)
      }),
    )))
    results.add('commands', `${c.concurrency} concurrent run('echo i'): wall`, wall)
    results.add('commands', `${c.concurrency} concurrent run('echo i'): per command`, perCommand)

    console.error('files')
    await fileRoundTrips(sbx, results, '1 KB', 1024, c.small, budget)
    await fileRoundTrips(sbx, results, '10 MB', 10 * 1024 * 1024, c.large, budget)

    console.error('profile of run(\'true\')')
    extra.profile = await profile(server, sbx, results, c, budget)

    console.error(`Sandbox.create + first command x${c.create}`)
    await createRounds(results, track, made, c.create, budget)

    extra.loadAvgEnd = os.loadavg()
    results.print()
    const load = (l) => l.map((x) => x.toFixed(1)).join(' ')
    console.log(`\nload average (1/5/15 min) at start ${load(extra.loadAvgStart)}, at end ${load(extra.loadAvgEnd)}; ${os.cpus().length} CPUs`)
    if (extra.profile?.loginShellTrace) console.log(`bash -l -c true runs:\n${extra.profile.loginShellTrace}`)
    if (opts.json) {
      const doc = { date: new Date().toISOString(), sdk: 'e2b@2.51.0', counts: c, figures: results.rows, ...extra }
      fs.writeFileSync(opts.json, JSON.stringify(doc, null, 2) + '\n')
      console.log(`\nwrote ${opts.json}`)
    }
  } catch (err) {
    // An interrupt kills the sandboxes under the running phase: not news.
    if (!stopping) throw err
  } finally {
    await cleanup()
  }
}

async function fileRoundTrips(sbx, results, label, size, count, budget) {
  const path = `/tmp/bench-${size}`
  const writes = []
  const reads = []
  const both = await repeat(count, budget, async () => {
    const data = randomBytes(size)
    const w0 = performance.now()
    await sbx.files.write(path, data.buffer.slice(data.byteOffset, data.byteOffset + data.length))
    const w1 = performance.now()
    const got = await sbx.files.read(path, { format: 'bytes' })
    const r1 = performance.now()
    if (Buffer.compare(Buffer.from(got), data) !== 0) throw new Error(`${label}: read back differs from what was written`)
    writes.push(w1 - w0)
    reads.push(r1 - w1)
    return r1 - w0
  })
  await sbx.files.remove(path)
  results.add('files', `${label} write`, writes)
  results.add('files', `${label} read`, reads)
  results.add('files', `${label} write + read`, both, size > 1024 * 1024 ? `${(size * 2 / 1024 / 1024 / (summarize(both).p50 / 1000)).toFixed(0)} MB/s at p50 (both ways)` : '')
}

async function createRounds(results, track, made, count, budget) {
  const creates = []
  const firsts = []
  const totals = await repeat(count, budget, async () => {
    const t0 = performance.now()
    const s = track(await Sandbox.create('base', { timeoutMs: 120_000 }))
    const t1 = performance.now()
    await s.commands.run('true')
    const t2 = performance.now()
    await s.kill()
    made.delete(s)
    creates.push(t1 - t0)
    firsts.push(t2 - t1)
    return t2 - t0
  })
  results.add('sandbox', 'Sandbox.create', creates)
  results.add('sandbox', "first run('true')", firsts)
  results.add('sandbox', 'create + first command', totals, 'back to back: each create takes a warm slot (--warm-slots 2) if one is ready')
}

// profile measures the same process along shorter and shorter paths.
async function profile(server, sbx, results, c, budget) {
  const n = c.profile
  const G = 'profile'
  const info = {}
  results.add(G, "SDK commands.run('true')  [bash -l -c true]", await repeat(n, budget, () => timed(() => sbx.commands.run('true'))))

  const viaProxy = server.url
  results.add(G, 'bare Connect Start via server proxy  [bash -l -c true]',
    await repeat(n, budget, () => timed(() => rawStart(viaProxy, sbx, '/bin/bash', ['-l', '-c', 'true']))))
  results.add(G, 'bare Connect Start via server proxy  [bash -c true]',
    await repeat(n, budget, () => timed(() => rawStart(viaProxy, sbx, '/bin/bash', ['-c', 'true']))))
  results.add(G, 'bare Connect Start via server proxy  [/bin/true]',
    await repeat(n, budget, () => timed(() => rawStart(viaProxy, sbx, '/bin/true', []))))

  // envd's own address: the server's proxy dials the sandbox IP directly.
  const ip = await sandboxIP(sbx)
  info.sandboxIP = ip
  let direct = null
  if (ip) {
    direct = `http://${ip}:49983`
    try {
      const res = await fetch(direct + '/health', { signal: AbortSignal.timeout(2000) })
      await res.arrayBuffer()
    } catch (err) {
      info.directError = err.message
      direct = null
    }
  }
  if (direct) {
    results.add(G, 'bare Connect Start direct to envd  [bash -l -c true]',
      await repeat(n, budget, () => timed(() => rawStart(direct, sbx, '/bin/bash', ['-l', '-c', 'true']))))
    results.add(G, 'bare Connect Start direct to envd  [/bin/true]',
      await repeat(n, budget, () => timed(() => rawStart(direct, sbx, '/bin/true', []))))
  } else {
    results.add(G, 'bare Connect Start direct to envd', [], `envd not reachable from the host (${info.directError || 'no sandbox IP'})`)
  }

  results.add(G, 'curl POST /execute  [bash -l -c true]', await curlExecute(server, sbx, n))

  // Inside the sandbox: bash's $EPOCHREALTIME costs no process, so the
  // loop measures the process start itself.
  for (const [label, cmd] of [['bash -l -c true', 'bash -l -c true'], ['bash -c true', 'bash -c true'], ['/bin/true', '/bin/true'], ['builtin : (loop floor)', ':']]) {
    const script = `for i in $(seq ${c.inside}); do s=$EPOCHREALTIME; ${cmd}; e=$EPOCHREALTIME; echo "$s $e"; done`
    const r = await sbx.commands.run(script, { timeoutMs: budget })
    const samples = r.stdout.trim().split('\n').map((l) => {
      const [s, e] = l.split(' ').map(Number)
      return (e - s) * 1000
    })
    results.add(G, `inside sandbox: ${label}`, samples)
  }
  // What the login shell does that a plain one does not.
  const trace = await sbx.commands.run('bash -l -x -c true 2>&1 | grep -v "^++* true$" | head -40')
  info.loginShellTrace = trace.stdout.trimEnd()
  return info
}

async function sandboxIP(sbx) {
  try {
    const r = await sbx.commands.run("hostname -I 2>/dev/null || ip -4 -o addr show scope global | awk '{print $4}'", { user: 'root' })
    const ip = r.stdout.trim().split(/\s+/)[0]?.split('/')[0]
    return /^\d+\.\d+\.\d+\.\d+$/.test(ip) ? ip : null
  } catch {
    return null
  }
}

// curlExecute times POST /sandboxes/{id}/execute with one curl process
// (one kept-alive connection) for n requests.
async function curlExecute(server, sbx, n) {
  const url = `${server.url}/sandboxes/${sbx.sandboxId}/execute`
  const args = ['-sS', '-X', 'POST', '-H', `X-API-Key: ${server.apiKey}`, '-H', 'Content-Type: application/json',
    '-d', '{"command":"true"}', '-w', '\n@@ %{http_code} %{time_total}\n']
  for (let i = 0; i < n; i++) args.push(url)
  const { stdout } = await execFileAsync('curl', args, { maxBuffer: 16 << 20, timeout: 300_000 })
  const samples = []
  for (const line of stdout.split('\n')) {
    if (!line.startsWith('@@ ')) {
      if (line.trim() && !line.includes('"exitCode":0')) throw new Error(`execute answered ${line}`)
      continue
    }
    const [, code, secs] = line.split(' ')
    if (code !== '200') throw new Error(`execute: HTTP ${code}`)
    samples.push(Number(secs) * 1000)
  }
  return samples
}

main().catch((err) => {
  console.error(err)
  process.exitCode = 1
})
