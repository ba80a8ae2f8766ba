// The SDK side of hosts.test.mjs, which runs this file under node's test
// runner with only E2B_DOMAIN and E2B_API_KEY set for the SDK, names
// resolved by a stub resolver to the server's HTTPS address
// (AENV_E2E_TLS_IP) and the server's lab CA trusted (NODE_EXTRA_CA_CERTS).
// Every request here, the SDK's and fetch's, is HTTPS to port 443 of a
// name under the domain.

import { after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import dns from 'node:dns/promises'
import { Sandbox } from 'e2b'
import { eventually } from './harness.mjs'

const domain = process.env.E2B_DOMAIN
const tlsIP = process.env.AENV_E2E_TLS_IP

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

// get fetches url and returns its status and body.
async function get(url, headers = {}) {
  const res = await fetch(url, { headers })
  return { status: res.status, body: await res.text() }
}

// serveFile starts python's HTTP server on port in sbx, serving a file
// whose content is body, and returns the URL of the file, once it answers
// (through the sandbox's https host, with headers). The SDK's stream of
// the server's output is let go (the server runs on): a stream cut by a
// pause makes the SDK check envd's health, which is traffic that resumes
// a sandbox with autoResume.
async function serveFile(sbx, port, body, headers = {}) {
  await sbx.files.write(`/tmp/www${port}/index.html`, body)
  const server = await sbx.commands.run(`cd /tmp/www${port} && python3 -m http.server ${port}`, { background: true, timeoutMs: 0 })
  await server.disconnect()
  const url = `https://${sbx.getHost(port)}/index.html`
  await eventually(async () => {
    const r = await get(url, headers)
    assert.equal(r.status, 200, `status ${r.status}: ${r.body}`)
  }, { timeoutMs: 60_000, intervalMs: 500 })
  return url
}

describe('host routes over https, the SDK given only E2B_DOMAIN', () => {
  const sandboxes = []
  const track = (sbx) => {
    sandboxes.push(sbx)
    return sbx
  }
  after(async () => {
    await Promise.all(sandboxes.map((s) => s.kill().catch(() => {})))
  })

  test('the names resolve to the HTTPS address and nothing else points the SDK at the server', async () => {
    assert.ok(domain && tlsIP, 'E2B_DOMAIN and AENV_E2E_TLS_IP must be set (run by hosts.test.mjs)')
    for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_DEBUG']) assert.equal(process.env[name], undefined, name)
    assert.deepEqual(await dns.lookup(`api.${domain}`, { all: true }), [{ address: tlsIP, family: 4 }])
    assert.deepEqual(await dns.lookup(`49983-abcdefghij0123456789.${domain}`, { all: true }), [{ address: tlsIP, family: 4 }])
  })

  test('create, commands and files go through https://api.<domain> and the envd host', async () => {
    const sbx = track(await Sandbox.create('base', { timeoutMs: 120_000 }))
    assert.equal(sbx.envdApiUrl, `https://49983-${sbx.sandboxId}.${domain}`)
    const r = await sbx.commands.run('echo over-https')
    assert.equal(r.stdout, 'over-https\n')
    await sbx.files.write('/tmp/tls.txt', 'written over https')
    assert.equal(await sbx.files.read('/tmp/tls.txt'), 'written over https')
    assert.ok((await Sandbox.list().nextItems()).some((s) => s.sandboxId === sbx.sandboxId))
    await sbx.kill()
  })

  test('getHost(port) is an https host that reaches a server in the sandbox', async () => {
    const sbx = track(await Sandbox.create('base', { timeoutMs: 120_000 }))
    const host = sbx.getHost(8000)
    assert.equal(host, `8000-${sbx.sandboxId}.${domain}`)
    const url = await serveFile(sbx, 8000, 'served in ' + sbx.sandboxId)
    assert.deepEqual(await get(url), { status: 200, body: 'served in ' + sbx.sandboxId })
    // A closed port is the proxy's error, over https too.
    assert.equal((await get(`https://${sbx.getHost(8999)}/`)).status, 502)
    await sbx.kill()
  })

  test('autoResume: an https request to a paused sandbox resumes it', async () => {
    const sbx = track(await Sandbox.create('base', { timeoutMs: 300_000, lifecycle: { onTimeout: 'pause', autoResume: true } }))
    const url = await serveFile(sbx, 8000, 'still here')
    await sbx.pause()
    assert.equal((await sbx.getInfo()).state, 'paused')
    // The server's process is in the paused memory: the request resumes
    // the sandbox and is answered by it.
    assert.deepEqual(await get(url), { status: 200, body: 'still here' })
    assert.equal((await sbx.getInfo()).state, 'running')
    await sbx.kill()
  })

  test('allowPublicTraffic false: the host needs e2b-traffic-access-token', async () => {
    const sbx = track(await Sandbox.create('base', { timeoutMs: 120_000, network: { allowPublicTraffic: false } }))
    const token = sbx.trafficAccessToken
    assert.ok(token, 'a private sandbox has a traffic access token')
    // envd is the SDK's own (its access token), not the traffic token's.
    const url = await serveFile(sbx, 8000, 'private', { 'e2b-traffic-access-token': token })
    assert.deepEqual(await get(url, { 'e2b-traffic-access-token': token }), { status: 200, body: 'private' })
    assert.equal((await get(url)).status, 403)
    assert.equal((await get(url, { 'e2b-traffic-access-token': token + 'x' })).status, 403)
    await sbx.kill()
  })

  test('maskRequestHost: the sandbox sees the masked Host, the https host forwarded', async () => {
    const sbx = track(await Sandbox.create('base', { timeoutMs: 120_000, network: { maskRequestHost: 'localhost:${PORT}' } }))
    await sbx.files.write('/tmp/echo.py', hostHeaderEcho)
    await sbx.commands.run('python3 /tmp/echo.py 8000', { background: true, timeoutMs: 0 })
    const host = sbx.getHost(8000)
    const r = await eventually(async () => {
      const r = await get(`https://${host}/`)
      assert.equal(r.status, 200, `status ${r.status}: ${r.body}`)
      return r
    }, { timeoutMs: 60_000, intervalMs: 500 })
    assert.equal(r.body, `localhost:8000|${host}`)
    await sbx.kill()
  })
})
