// Harness of the end-to-end suite: starts a real `aenv server` (as root)
// with its own data dir, network prefix and address range, points the E2B
// SDK at it through the environment (as a user would), and at the end stops
// it with SIGTERM and checks that it left nothing behind.
//
// Each test file starts its own server in `before` and stops it in `after`,
// so files are independent; run.sh runs them one at a time.

import { spawn, execFileSync } from 'node:child_process'
import { randomBytes, randomInt } from 'node:crypto'
import fs from 'node:fs'
import http from 'node:http'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { setTimeout as sleep } from 'node:timers/promises'

const here = path.dirname(fileURLToPath(import.meta.url))

// The base template is built once per machine into this cache (minutes the
// first time) and shared with the Go integration tests.
const templateCacheDir = process.env.AENV_TEMPLATE_CACHE_DIR || '/var/cache/aenv-test'

export const binDir = path.resolve(process.env.AENV_BIN_DIR || path.join(here, '..', 'bin'))

function randomName(n) {
  const alphabet = 'abcdefghijklmnopqrstuvwxyz0123456789'
  let s = ''
  for (let i = 0; i < n; i++) s += alphabet[randomInt(alphabet.length)]
  return s
}

async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
  })
}

// raceEnv is the environment of an aenv process: a race-enabled one (make
// test's) writes its race reports to files in dir (race.<pid>) rather than
// among its logs, and goes on after one, so that raceReports finds them all
// when it stops. A static aenv ignores it.
function raceEnv(dir) {
  return { ...process.env, GORACE: `log_path=${path.join(dir, 'race')} halt_on_error=0` }
}

// raceReports returns the race reports that a stopped process (what) left
// in dir, one entry per report file.
function raceReports(what, dir) {
  const found = []
  let names = []
  try {
    names = fs.readdirSync(dir)
  } catch {
    // no dir: no reports
  }
  for (const name of names.filter((n) => n.startsWith('race.')).sort()) {
    const text = fs.readFileSync(path.join(dir, name), 'utf8')
    if (text.trim()) found.push(`${what}: the race detector reported (${name}):\n${text}`)
  }
  return found
}

function requireSetup() {
  if (process.getuid?.() !== 0) {
    throw new Error('the e2e suite needs root (aenv server runs gVisor sandboxes)')
  }
  for (const name of ['aenv', 'envd', 'runsc']) {
    if (!fs.existsSync(path.join(binDir, name))) {
      throw new Error(`${name} missing in ${binDir} (run \`make build\` or set AENV_BIN_DIR)`)
    }
  }
}

// randomLoopback is an address in 127.0.0.0/8 outside 127.0.0.0/16, where
// a run can listen on a fixed port (443, 53) that concurrent runs, on
// addresses of their own, also use.
export function randomLoopback() {
  return `127.${randomInt(1, 255)}.${randomInt(0, 256)}.${randomInt(1, 255)}`
}

// newTLS is the HTTPS setup of a server or gateway as a deployment has it:
// a domain of its own (E2B_DOMAIN), under which api.<domain> and every
// <port>-<id>.<domain> are served on port 443 of one address, with a lab
// CA's certificate. Clients resolve the names through a resolver of the
// test's (hosts.test.mjs) and trust the CA through caFile.
function newTLS() {
  return { domain: `${randomName(10)}.aenv.test`, ip: randomLoopback(), caFile: null }
}

// exportCA writes what `aenv ca export` prints (the lab CA clients trust)
// to a file of the harness's and returns its path.
function exportCA(args) {
  const pem = execFileSync(path.join(binDir, 'aenv'), ['ca', 'export', ...args], { encoding: 'utf8' })
  if (!pem.includes('BEGIN CERTIFICATE')) throw new Error(`aenv ca export ${args.join(' ')} printed no certificate: ${pem}`)
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'aenv-e2e-ca-')), 'ca.pem')
  fs.writeFileSync(file, pem)
  return file
}

function removeCA(tls) {
  if (tls?.caFile) fs.rmSync(path.dirname(tls.caFile), { recursive: true, force: true })
}

// A running `aenv server` and what the tests need to reach it.
export class AenvServer {
  // cluster, when given ({ databaseUrl, nodeId }), makes this an `aenv
  // node` of that cluster instead of a single server. tls (a single
  // server's) adds an HTTPS listener on a domain of its own (newTLS);
  // domain (a node's) is its cluster's domain.
  // volumePoolGB, when given, keeps its volumes in a volume pool.
  constructor({ cluster, tls, domain, dnsHostsFile, egressUpstreamCAFile, volumePoolGB } = {}) {
    this.cluster = cluster
    this.tls = tls
    this.volumePoolGB = volumePoolGB
    this.egressUpstreamCAFile = egressUpstreamCAFile
    this.dnsHostsFile = dnsHostsFile
    this.domain = tls?.domain || domain
    this.dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'aenv-e2e-'))
    // The server wants the prefix to start and end with a letter.
    this.prefix = 'e2' + randomName(3) + 'abcdefghijklmnopqrstuvwxyz'[randomInt(26)]
    this.cidr = `10.${randomInt(100, 200)}.${randomInt(0, 256)}.0/24`
    this.apiKey = 'e2e_' + randomBytes(12).toString('hex')
    this.logPath = path.join(this.dataDir, 'server.log')
    // Beside the data dir, which the server owns.
    this.raceDir = fs.mkdtempSync(path.join(os.tmpdir(), 'aenv-e2e-race-'))
    this.proc = null
    this.exited = null
    this.cleanups = []
  }

  // defer runs fn before the server stops (node:test runs a suite's after
  // hooks in registration order, so the server's would run first).
  defer(fn) {
    this.cleanups.push(fn)
  }

  // start launches the server and waits until it is healthy. The port is
  // picked free and let go before the server binds it, so the server may
  // find it taken meanwhile (by one of its own listeners on an ephemeral
  // port, or another process): it then starts again on another port.
  async start() {
    requireSetup()
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.startOnce()
      } catch (err) {
        if (attempt >= 5 || !/listen api on [^:]+:\d+: .*address already in use/.test(err.message)) throw err
        console.error(`aenv server: port ${this.port} was taken before it bound it; trying another`)
      }
    }
  }

  async startOnce() {
    this.port = await freePort()
    this.url = `http://127.0.0.1:${this.port}`
    const identity = this.cluster
      ? ['node', '--database-url', this.cluster.databaseUrl, '--node-id', this.cluster.nodeId,
          '--advertise', `127.0.0.1:${this.port}`, '--heartbeat-interval-ms', '200']
      : ['server', '--api-key', this.apiKey]
    const args = [
      ...identity,
      '--data-dir', this.dataDir,
      '--listen', `127.0.0.1:${this.port}`,
      '--template-cache-dir', templateCacheDir,
      '--net-prefix', this.prefix,
      '--sandbox-cidr', this.cidr,
      '--warm-slots', '2',
      // gVisor's kvm platform hangs on some hosts; auto probes it for 5 s.
      '--platform', process.env.AENV_E2E_PLATFORM || 'systrap',
      '--kill-on-exit',
      '--log-level', process.env.AENV_E2E_LOG_LEVEL || 'debug',
    ]
    if (this.domain) args.push('--domain', this.domain)
    if (this.dnsHostsFile) args.push('--dns-hosts-file', this.dnsHostsFile)
    if (this.egressUpstreamCAFile) args.push('--egress-upstream-ca-file', this.egressUpstreamCAFile)
    if (this.volumePoolGB) args.push('--volume-pool-gb', String(this.volumePoolGB))
    // Lab CA mode: the CA is made in <data-dir>/tls at the first start.
    if (this.tls) args.push('--tls-listen', `${this.tls.ip}:443`)
    const log = fs.openSync(this.logPath, 'a')
    this.proc = spawn(path.join(binDir, 'aenv'), args, { stdio: ['ignore', log, log], env: raceEnv(this.raceDir) })
    fs.closeSync(log)
    this.exited = new Promise((resolve) => this.proc.once('exit', (code, signal) => resolve({ code, signal })))
    let exitedEarly = null
    this.exited.then((r) => { exitedEarly = r })

    // The first server on a machine builds the base template (minutes).
    const deadline = Date.now() + 15 * 60_000
    while (Date.now() < deadline) {
      if (exitedEarly) {
        throw new Error(`aenv server exited during start (${JSON.stringify(exitedEarly)}):\n${this.logTail()}`)
      }
      try {
        const res = await fetch(this.url + '/health')
        await res.arrayBuffer()
        if (res.status === 200) break
      } catch {
        // not listening yet
      }
      await sleep(100)
    }
    if (Date.now() >= deadline) throw new Error(`aenv server did not become healthy:\n${this.logTail()}`)
    if (this.cluster) return this // users reach it through a gateway
    if (this.tls) this.tls.caFile = exportCA(['--data-dir', this.dataDir])

    // Point the unmodified SDK at this server, as the README tells users to.
    // With AENV_E2E_TRACE=1 it goes through a logging proxy instead.
    let sdkUrl = this.url
    if (process.env.AENV_E2E_TRACE === '1') {
      this.tracer = await startTracer(this.port, path.join(this.dataDir, 'traffic.log'))
      sdkUrl = this.tracer.url
    }
    this.sdkUrl = sdkUrl
    pointSdkAt(sdkUrl, this.apiKey)
    return this
  }

  logTail(lines = 80) {
    try {
      return fs.readFileSync(this.logPath, 'utf8').split('\n').slice(-lines).join('\n')
    } catch {
      return '(no log)'
    }
  }

  // stop ends the server with SIGTERM (--kill-on-exit kills its sandboxes)
  // and returns the list of things it left behind and of its race reports
  // (empty when clean).
  async stop() {
    if (!this.proc) {
      fs.rmSync(this.raceDir, { recursive: true, force: true })
      return []
    }
    this.tracer?.close()
    removeCA(this.tls)
    const proc = this.proc
    this.proc = null
    proc.kill('SIGTERM')
    let timer
    const timeout = new Promise((resolve) => { timer = setTimeout(() => resolve('timeout'), 90_000) })
    const result = await Promise.race([this.exited, timeout])
    clearTimeout(timer)
    const leaks = []
    if (result === 'timeout') {
      proc.kill('SIGKILL')
      await this.exited
      leaks.push('server did not stop within 90 s of SIGTERM')
    }
    leaks.push(...this.leftovers())
    leaks.push(...raceReports(`aenv server ${this.url}`, this.raceDir))
    fs.rmSync(this.raceDir, { recursive: true, force: true })
    this.saveLogs()
    if (leaks.length === 0 && process.env.AENV_E2E_KEEP !== '1') {
      fs.rmSync(this.dataDir, { recursive: true, force: true })
    }
    return leaks
  }

  // saveLogs copies the server log (and traffic log) out of the data dir,
  // which is removed, so failures can be looked into after the run.
  saveLogs() {
    const dir = process.env.AENV_E2E_LOG_DIR || path.join(os.tmpdir(), 'aenv-e2e-logs')
    fs.mkdirSync(dir, { recursive: true })
    const base = path.join(dir, `${path.basename(process.argv[1] || 'e2e', '.mjs')}-${this.prefix}`)
    for (const [from, suffix] of [[this.logPath, '.server.log'], [path.join(this.dataDir, 'traffic.log'), '.traffic.log']]) {
      if (fs.existsSync(from)) fs.copyFileSync(from, base + suffix)
    }
    console.error(`aenv server log: ${base}.server.log`)
  }

  // leftovers lists processes of this server's data dir and network
  // namespaces or interfaces with its prefix.
  leftovers() {
    const found = []
    let procs = ''
    try {
      procs = execFileSync('pgrep', ['-af', this.dataDir], { encoding: 'utf8' })
    } catch {
      // pgrep exits 1 when nothing matches
    }
    // pgrep -f can match itself through the shell on some systems; ignore it.
    for (const line of procs.split('\n')) {
      if (line.trim() && !line.includes('pgrep')) found.push(`process left behind: ${line}`)
    }
    for (const [dir, what] of [['/var/run/netns', 'network namespace'], ['/sys/class/net', 'network interface']]) {
      let names = []
      try {
        names = fs.readdirSync(dir)
      } catch {
        // directory absent: nothing left
      }
      for (const name of names) {
        if (name.startsWith(this.prefix)) found.push(`${what} left behind: ${name}`)
      }
    }
    const mounts = fs.readFileSync('/proc/self/mountinfo', 'utf8')
    for (const line of mounts.split('\n')) {
      if (line.includes(this.dataDir)) found.push(`mount left behind: ${line}`)
    }
    return found
  }
}

// AenvCluster is three `aenv node`s and an `aenv gateway` over the
// PostgreSQL database at databaseUrl, with the SDK pointed at the gateway:
// the suite then runs unchanged against a cluster (AENV_E2E_DATABASE_URL).
export class AenvCluster {
  // tls puts the gateway's HTTPS listener on a domain of its own (newTLS),
  // which the nodes are given as their --domain.
  constructor(databaseUrl, { tls, dnsHostsFile, egressUpstreamCAFile, volumePoolGB } = {}) {
    this.databaseUrl = databaseUrl
    this.tls = tls
    const name = randomName(5)
    this.nodes = [0, 1, 2].map((i) => new AenvServer({ cluster: { databaseUrl, nodeId: `e2e-${name}-${i}` }, domain: tls?.domain, dnsHostsFile,
      egressUpstreamCAFile, volumePoolGB }))
    this.apiKey = 'e2e_' + randomBytes(12).toString('hex')
    this.dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'aenv-e2e-gateway-'))
    this.logPath = path.join(this.dataDir, 'gateway.log')
    this.prefix = 'gateway-' + name
    this.cleanups = []
  }

  defer(fn) {
    this.cleanups.push(fn)
  }

  async start() {
    requireSetup()
    await Promise.all(this.nodes.map((n) => n.start()))
    this.port = await freePort()
    this.url = `http://127.0.0.1:${this.port}`
    const args = [
      'gateway', '--database-url', this.databaseUrl, '--listen', `127.0.0.1:${this.port}`,
      '--api-key', this.apiKey, '--node-timeout-ms', '2000',
      '--log-level', process.env.AENV_E2E_LOG_LEVEL || 'debug',
    ]
    // The gateway has no data dir: its lab CA goes beside its log.
    const caDir = path.join(this.dataDir, 'tls')
    if (this.tls) args.push('--domain', this.tls.domain, '--tls-listen', `${this.tls.ip}:443`, '--tls-ca-dir', caDir)
    const log = fs.openSync(this.logPath, 'a')
    this.proc = spawn(path.join(binDir, 'aenv'), args, { stdio: ['ignore', log, log], env: raceEnv(this.dataDir) })
    fs.closeSync(log)
    this.exited = new Promise((resolve) => this.proc.once('exit', (code, signal) => resolve({ code, signal })))
    let exitedEarly = null
    this.exited.then((r) => { exitedEarly = r })
    const want = new Set(this.nodes.map((n) => n.cluster.nodeId))
    const deadline = Date.now() + 60_000
    for (;;) {
      if (exitedEarly) throw new Error(`aenv gateway exited during start (${JSON.stringify(exitedEarly)}):\n${this.logTail()}`)
      if (Date.now() > deadline) throw new Error(`the cluster's nodes did not become ready:\n${this.logTail()}`)
      try {
        const res = await fetch(this.url + '/cluster/nodes', { headers: { 'X-API-Key': this.apiKey } })
        const nodes = res.status === 200 ? await res.json() : []
        if (nodes.filter((n) => want.has(n.id) && n.state === 'ready').length === want.size) break
      } catch {
        // not listening yet
      }
      await sleep(100)
    }
    if (this.tls) this.tls.caFile = exportCA(['--tls-ca-dir', caDir])
    this.sdkUrl = this.url
    pointSdkAt(this.url, this.apiKey)
    return this
  }

  logTail(lines = 80) {
    try {
      return fs.readFileSync(this.logPath, 'utf8').split('\n').slice(-lines).join('\n')
    } catch {
      return '(no log)'
    }
  }

  // stop ends the gateway, then the nodes (each killing its sandboxes and
  // leaving the cluster), and returns what any of them left behind or the
  // race detector reported.
  async stop() {
    const leaks = []
    removeCA(this.tls)
    if (this.proc) {
      const proc = this.proc
      this.proc = null
      proc.kill('SIGTERM')
      let timer
      const timeout = new Promise((resolve) => { timer = setTimeout(() => resolve('timeout'), 30_000) })
      if (await Promise.race([this.exited, timeout]) === 'timeout') {
        proc.kill('SIGKILL')
        leaks.push('gateway did not stop within 30 s of SIGTERM')
      }
      clearTimeout(timer)
      leaks.push(...raceReports(`aenv gateway ${this.url}`, this.dataDir))
    }
    for (const n of this.nodes) leaks.push(...await n.stop())
    const dir = process.env.AENV_E2E_LOG_DIR || path.join(os.tmpdir(), 'aenv-e2e-logs')
    fs.mkdirSync(dir, { recursive: true })
    const saved = path.join(dir, `${path.basename(process.argv[1] || 'e2e', '.mjs')}-${this.prefix}.gateway.log`)
    if (fs.existsSync(this.logPath)) fs.copyFileSync(this.logPath, saved)
    console.error(`aenv gateway log: ${saved}`)
    if (leaks.length === 0) fs.rmSync(this.dataDir, { recursive: true, force: true })
    return leaks
  }
}

// startTracer is a pass-through HTTP proxy to 127.0.0.1:port that logs
// every request and the start of every response to logPath (for reporting
// server bugs with the exact traffic).
async function startTracer(port, logPath) {
  const out = fs.createWriteStream(logPath, { flags: 'a' })
  const preview = (buf) => {
    const text = buf.toString('latin1')
    return /^[\x09\x0a\x0d\x20-\x7e]*$/.test(text) ? text.slice(0, 1500) : `<${buf.length} bytes> ` + JSON.stringify(text.slice(0, 300))
  }
  let n = 0
  // One upstream connection per request: keeps the tracer out of keep-alive
  // races of its own.
  const agent = new http.Agent({ keepAlive: false })
  const server = http.createServer((req, res) => {
    const id = ++n
    const reqChunks = []
    let reqLen = 0
    req.on('data', (c) => { if (reqLen < 4096) reqChunks.push(c); reqLen += c.length })
    const upstream = http.request({ host: '127.0.0.1', port, agent, method: req.method, path: req.url, headers: req.headers }, (ures) => {
      res.writeHead(ures.statusCode, ures.headers)
      const resChunks = []
      let resLen = 0
      ures.on('data', (c) => { if (resLen < 4096) resChunks.push(c); resLen += c.length; res.write(c) })
      ures.on('end', () => {
        res.end()
        out.write(`#${id} <- ${ures.statusCode} ${JSON.stringify(ures.headers)}\n   body(${resLen}): ${preview(Buffer.concat(resChunks))}\n`)
      })
    })
    upstream.on('error', (err) => { out.write(`#${id} upstream error ${err.message}\n`); res.destroy() })
    req.on('end', () => {
      const h = { ...req.headers }
      out.write(`#${id} -> ${req.method} ${req.url} ${JSON.stringify(h)}\n   body(${reqLen}): ${preview(Buffer.concat(reqChunks))}\n`)
    })
    req.pipe(upstream)
    // Pass a client abort on; a finished response leaves the upstream
    // connection alone (to be reused, as the SDK's own would be).
    res.on('close', () => { if (!res.writableFinished) upstream.destroy() })
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => { server.closeAllConnections(); server.close(); agent.destroy(); out.end() },
  }
}

// useServer starts a server for the calling test file: call it at module
// top level with node:test's before/after. With tls the server (or the
// cluster's gateway) also serves HTTPS on a domain of its own: server.tls
// has the domain, the address whose port 443 it listens on and the file
// of the lab CA to trust.
//
// dnsHostsFile, a hosts file, names hosts a test makes (FakeHost) for the
// sandboxes' DNS (aenv's --dns-hosts-file).
//
// egressUpstreamCAFile is a CA the egress gateway trusts for the hosts it
// intercepts (network rules): FakeHost's HTTPS (see TestCA).
export function useServer({ before, after, tls = false, dnsHostsFile, egressUpstreamCAFile, volumePoolGB }) {
  const databaseUrl = process.env.AENV_E2E_DATABASE_URL
  let server
  if (process.env.AENV_E2E_URL) {
    if (tls || dnsHostsFile || egressUpstreamCAFile) {
      throw new Error('this file needs a server of its own (TLS, DNS hosts or an egress CA): not one for AENV_E2E_URL')
    }
    if (volumePoolGB && process.env.AENV_E2E_VOLUME_POOL !== '1') {
      throw new Error('this file needs volume pools: set AENV_E2E_VOLUME_POOL=1 if the nodes of AENV_E2E_URL keep them')
    }
    server = new AenvTarget(process.env.AENV_E2E_URL, process.env.AENV_E2E_API_KEY)
  } else {
    const opts = { tls: tls ? newTLS() : undefined, dnsHostsFile, egressUpstreamCAFile, volumePoolGB }
    server = databaseUrl ? new AenvCluster(databaseUrl, opts) : new AenvServer(opts)
  }
  before(async () => {
    await server.start()
  }, { timeout: 16 * 60_000 })
  after(async () => {
    for (const fn of server.cleanups.reverse()) {
      try {
        await fn()
      } catch (err) {
        console.error('cleanup before server stop failed:', err)
      }
    }
    const leaks = await server.stop()
    if (leaks.length > 0) {
      throw new Error('aenv server left things behind or raced:\n' + leaks.join('\n'))
    }
  }, { timeout: 120_000 })
  return server
}

// pointSdkAt makes the E2B SDK's calls go to url with apiKey: its API,
// sandboxes (envd, through the proxy) and volumes alike.
function pointSdkAt(url, apiKey) {
  process.env.E2B_API_URL = url
  process.env.E2B_SANDBOX_URL = url
  process.env.E2B_VOLUME_API_URL = url
  process.env.E2B_API_KEY = apiKey
  delete process.env.E2B_DEBUG
  delete process.env.E2B_DOMAIN
}

// AenvTarget is a deployment the suite did not start (AENV_E2E_URL, with
// AENV_E2E_API_KEY): the files that need nothing of a server's own (its
// flags, logs or data) run against it unchanged, e.g. the compose
// cluster's gateway (test/integration's TestComposeClusterInPodman). What
// it leaves behind is its operator's to check.
class AenvTarget {
  constructor(url, apiKey) {
    if (!apiKey) throw new Error('AENV_E2E_URL needs AENV_E2E_API_KEY')
    this.url = url
    this.apiKey = apiKey
    this.cleanups = []
  }

  defer(fn) {
    this.cleanups.push(fn)
  }

  async start() {
    this.sdkUrl = this.url
    pointSdkAt(this.url, this.apiKey)
    return this
  }

  async stop() {
    return []
  }
}

// eventually retries fn until it returns without throwing or timeoutMs passes.
export async function eventually(fn, { timeoutMs = 10_000, intervalMs = 100 } = {}) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    try {
      return await fn()
    } catch (err) {
      if (Date.now() > deadline) throw err
    }
    await sleep(intervalMs)
  }
}

// rejectsWith asserts that promise rejects with an instance of cls and
// returns the error for further checks.
export async function rejectsWith(promise, cls, what = '') {
  try {
    await promise
  } catch (err) {
    if (!(err instanceof cls)) {
      const e = new Error(`${what}: expected ${cls.name}, got ${err?.constructor?.name}: ${err?.message}`)
      e.cause = err
      throw e
    }
    return err
  }
  throw new Error(`${what}: expected ${cls.name}, but the call succeeded`)
}

// FakeHost is a host on "the internet" made for a test: a network namespace
// holding a public test address (TEST-NET-2), routed from the machine
// through a veth, whose HTTP server on port 80 answers which host it is and
// the Host it was asked for, and whose SOCKS5 proxy on port 1080 (user
// "agent", password "s3cret") logs each destination in lines ("socks:
// host:port user=agent"), resolving names from names ({name: address}).
// Nothing is routed anywhere else. Its address is fixed at construction
// (for a hosts file written before the server starts); start makes it.
let fakeHostSeq = randomInt(0, 40)
export class FakeHost {
  constructor(label) {
    this.label = label
    const n = 100 + (fakeHostSeq++ % 40)
    this.addr = `198.51.100.${n}`
    this.hostAddr = `192.0.2.${(n - 100) * 4 + 1}`
    this.peerAddr = `192.0.2.${(n - 100) * 4 + 2}`
    this.ns = 'e2f' + randomName(5)
    this.proc = null
  }

  async start() {
    const ns = this.ns
    const hostIf = ns + 'h'
    const peerIf = ns + 'p'
    const ip = (...args) => execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] })
    ip('netns', 'add', ns)
    ip('link', 'add', hostIf, 'type', 'veth', 'peer', 'name', peerIf, 'netns', ns)
    ip('addr', 'add', this.hostAddr + '/30', 'dev', hostIf)
    ip('link', 'set', hostIf, 'up')
    execFileSync('sysctl', ['-qw', `net.ipv4.conf.${hostIf}.forwarding=1`])
    ip('route', 'add', this.addr + '/32', 'dev', hostIf)
    ip('-n', ns, 'addr', 'add', this.peerAddr + '/30', 'dev', peerIf)
    ip('-n', ns, 'addr', 'add', this.addr + '/32', 'dev', peerIf)
    ip('-n', ns, 'link', 'set', peerIf, 'up')
    ip('-n', ns, 'link', 'set', 'lo', 'up')
    ip('-n', ns, 'route', 'add', 'default', 'via', this.hostAddr)
    // The servers (fixtures/fakehost.mjs): HTTP on 80, SOCKS5 on 1080.
    const script = path.join(here, 'fixtures', 'fakehost.mjs')
    this.lines = []
    const env = { ...process.env, FAKE_HOSTS: JSON.stringify(this.names || {}) }
    if (this.cert) Object.assign(env, { FAKE_TLS_CERT: this.cert.cert, FAKE_TLS_KEY: this.cert.key })
    this.proc = spawn('ip', ['netns', 'exec', ns, process.execPath, script, this.label, this.addr], {
      stdio: ['ignore', 'pipe', 'inherit'], env,
    })
    await new Promise((resolve, reject) => {
      let partial = ''
      this.proc.stdout.on('data', (d) => {
        const parts = (partial + d).split('\n')
        partial = parts.pop()
        for (const line of parts) {
          if (line === 'ready') resolve()
          else this.lines.push(line)
        }
      })
      this.proc.once('exit', (code) => reject(new Error(`fake host ${this.label} exited: ${code}`)))
    })
    return this
  }

  stop() {
    this.proc?.kill()
    const quiet = (...args) => { try { execFileSync('ip', args, { stdio: 'ignore' }) } catch {} }
    quiet('route', 'del', this.addr + '/32')
    quiet('link', 'del', this.ns + 'h')
    quiet('netns', 'del', this.ns)
  }
}

// writeHostsFile writes a hosts file of [address, ...names] entries and
// returns its path.
export function writeHostsFile(entries) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'aenv-e2e-hosts-'))
  const file = path.join(dir, 'hosts')
  fs.writeFileSync(file, entries.map((e) => e.join(' ')).join('\n') + '\n')
  return file
}

// TestCA is a certificate authority made for one test file (by openssl):
// caFile is its certificate; issue(names) returns the files of a server
// certificate for names, which FakeHost.cert takes to serve HTTPS on 443.
export class TestCA {
  constructor() {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'aenv-e2e-ca-'))
    this.caFile = path.join(this.dir, 'ca.pem')
    this.keyFile = path.join(this.dir, 'ca-key.pem')
    execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
      '-subj', '/CN=aenv e2e test CA', '-days', '2', '-keyout', this.keyFile, '-out', this.caFile], { stdio: 'ignore' })
    this.seq = 0
  }

  issue(names) {
    const base = path.join(this.dir, `leaf${this.seq++}`)
    const ext = base + '.ext'
    fs.writeFileSync(ext, `subjectAltName=${names.map((n) => 'DNS:' + n).join(',')}\nextendedKeyUsage=serverAuth\n`)
    execFileSync('openssl', ['req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-subj', `/CN=${names[0]}`,
      '-keyout', base + '.key', '-out', base + '.csr'], { stdio: 'ignore' })
    execFileSync('openssl', ['x509', '-req', '-in', base + '.csr', '-CA', this.caFile, '-CAkey', this.keyFile,
      '-CAcreateserial', '-days', '2', '-extfile', ext, '-out', base + '.pem'], { stdio: 'ignore' })
    return { cert: base + '.pem', key: base + '.key' }
  }

  remove() {
    fs.rmSync(this.dir, { recursive: true, force: true })
  }
}
