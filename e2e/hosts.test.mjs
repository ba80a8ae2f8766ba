// E2B's host features over HTTPS, reached as on a real deployment: the SDK
// is given only E2B_DOMAIN and E2B_API_KEY, so it calls
// https://api.<domain> and https://<port>-<id>.<domain> on port 443, finds
// them through DNS and checks their certificate against the CA it trusts.
//
// The server (or, with AENV_E2E_CLUSTER=1, the gateway) serves HTTPS on
// port 443 of a loopback address of its own with its lab CA. The SDK runs
// in a child process (hosts-client.mjs) inside a mount namespace of its
// own, whose /etc/resolv.conf names a stub resolver (dnsstub, built by
// make test-prepare) that answers for the domain with that address;
// NODE_EXTRA_CA_CERTS, which node reads at start, has it trust `aenv ca
// export`'s CA. Every address is random, so concurrent runs never meet.

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { useServer, binDir, randomLoopback } from './harness.mjs'

const here = path.dirname(fileURLToPath(import.meta.url))

describe('host routes over https', () => {
  const server = useServer({ before, after, tls: true })
  let resolver
  before(async () => {
    resolver = await startResolver(server.tls)
  })
  after(async () => {
    await resolver?.stop()
  })

  test('the E2B SDK given only E2B_DOMAIN: envd, getHost, autoResume, private traffic, maskRequestHost', { timeout: 20 * 60_000 }, async (t) => {
    const { code, signal, output } = await runClient(resolver, server, t.signal)
    assert.equal(code, 0, `hosts-client.mjs failed (${signal || 'exit ' + code}):\n${output}`)
  })
})

// startResolver runs dnsstub on port 53 of a loopback address of its own,
// answering for tls.domain and every name under it with tls.ip, and writes
// a resolv.conf naming it.
async function startResolver(tls) {
  const bin = path.join(binDir, 'dnsstub')
  if (!fs.existsSync(bin)) throw new Error(`${bin} missing (run \`make test-prepare\`)`)
  const ip = randomLoopback()
  const proc = spawn(bin, ['-listen', `${ip}:53`, '-zone', `${tls.domain}=${tls.ip}`], { stdio: ['ignore', 'pipe', 'pipe'] })
  const exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal })))
  let out = ''
  await new Promise((resolve, reject) => {
    proc.stdout.on('data', (chunk) => {
      out += chunk
      if (out.includes('listening')) resolve()
    })
    proc.stderr.on('data', (chunk) => { out += chunk })
    exited.then((r) => reject(new Error(`dnsstub exited (${JSON.stringify(r)}): ${out}`)))
  })
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'aenv-e2e-resolv-'))
  const resolvConf = path.join(dir, 'resolv.conf')
  fs.writeFileSync(resolvConf, `nameserver ${ip}\noptions attempts:2 timeout:2\n`)
  return {
    resolvConf,
    async stop() {
      proc.kill('SIGTERM')
      await exited
      fs.rmSync(dir, { recursive: true, force: true })
    },
  }
}

// runClient runs hosts-client.mjs under node's test runner in a new mount
// namespace whose /etc/resolv.conf is the resolver's, with the SDK's
// environment as a user of the deployment would set it, and returns how it
// ended and what it printed (also passed on to stderr as it comes). The
// child is ended when signal aborts (the test timed out).
async function runClient(resolver, server, signal) {
  const env = { ...process.env }
  // The runner marks the processes of its test files; the child is a
  // runner of its own.
  delete env.NODE_TEST_CONTEXT
  for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_DEBUG', 'E2B_ACCESS_TOKEN']) delete env[name]
  Object.assign(env, {
    E2B_DOMAIN: server.tls.domain,
    E2B_API_KEY: server.apiKey,
    NODE_EXTRA_CA_CERTS: server.tls.caFile,
    AENV_E2E_TLS_IP: server.tls.ip,
  })
  let output = ''
  const child = spawn('unshare', [
    '--mount', '--propagation', 'private', '--',
    'sh', '-c', 'mount --bind "$0" /etc/resolv.conf && exec "$@"', resolver.resolvConf,
    process.execPath, '--test', '--test-reporter=spec', path.join(here, 'hosts-client.mjs'),
  ], { cwd: here, env, stdio: ['ignore', 'pipe', 'pipe'], signal })
  child.on('error', (err) => { output += `\n${err.message}\n` })
  const collect = (chunk) => {
    output += chunk
    process.stderr.write(chunk)
  }
  child.stdout.on('data', collect)
  child.stderr.on('data', collect)
  const [code, ended] = await new Promise((resolve) => child.once('close', (c, s) => resolve([c, s])))
  return { code, signal: ended, output }
}
