// Egress by host name through the unmodified E2B SDK (e2b@2.51):
// network.allowOut with names and wildcards beside denyOut: [ALL_TRAFFIC],
// updateNetwork at runtime, the errors E2B's rules give, and egressProxy
// (a SOCKS5 proxy on one of the hosts), and network.rules' header transforms
// with a Secret (an HTTPS host with a certificate of the test's CA). The
// hosts are made by the test (FakeHost) and named by the server's
// --dns-hosts-file.
// Alone and through a gateway.

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { Sandbox, SandboxError, Secret, ALL_TRAFFIC } from 'e2b'
import { useServer, rejectsWith, FakeHost, TestCA, writeHostsFile } from './harness.mjs'

describe('egress by name', () => {
  const a = new FakeHost('a')
  a.names = { 'allowed.e2e.test': a.addr }
  const b = new FakeHost('b')
  const ca = new TestCA()
  const c = new FakeHost('c')
  c.cert = ca.issue(['api.e2e.test', 'plain.e2e.test'])
  const dnsHostsFile = writeHostsFile([
    [a.addr, 'allowed.e2e.test', 'api.wild.e2e.test', 'wild.e2e.test'],
    [b.addr, 'other.e2e.test'],
    [c.addr, 'api.e2e.test', 'plain.e2e.test'],
  ])
  const server = useServer({ before, after, dnsHostsFile, egressUpstreamCAFile: ca.caFile })
  before(async () => {
    await a.start()
    await b.start()
    await c.start()
  })
  after(() => {
    a.stop()
    b.stop()
    c.stop()
    ca.remove()
  })

  // fetch asks for url from inside the sandbox; it answers the body, or
  // 'refused' when nothing came back.
  async function fetchIn(sbx, url, args = '') {
    const r = await sbx.commands.run(`curl -s -m 10 ${args} ${url} || echo refused`)
    return r.stdout.trim()
  }

  test('names in allowOut, with everything else denied, reach only those hosts', async () => {
    const sbx = await Sandbox.create('base', {
      network: { allowOut: ['allowed.e2e.test', '*.wild.e2e.test'], denyOut: [ALL_TRAFFIC] },
    })
    server.defer(() => sbx.kill())
    assert.equal(await fetchIn(sbx, 'http://allowed.e2e.test/'), 'host=a hosthdr=allowed.e2e.test')
    assert.equal(await fetchIn(sbx, 'http://api.wild.e2e.test/'), 'host=a hosthdr=api.wild.e2e.test')
    // A wildcard covers the names under its domain, not the domain. Names
    // not allowed do not resolve; given an address, the node refuses them.
    assert.equal(await fetchIn(sbx, 'http://wild.e2e.test/'), 'refused')
    assert.match(await fetchIn(sbx, 'http://wild.e2e.test/', `--resolve wild.e2e.test:80:${a.addr}`), /aenv egress: wild.e2e.test is not in allowOut/)
    assert.equal(await fetchIn(sbx, 'http://other.e2e.test/'), 'refused')
    // The allowed name sent to the other host's address still reaches the
    // allowed host: the node dials the name, not the address.
    assert.equal(await fetchIn(sbx, 'http://allowed.e2e.test/', `--resolve allowed.e2e.test:80:${b.addr}`), 'host=a hosthdr=allowed.e2e.test')
    // By address, with no allowed name: refused.
    assert.match(await fetchIn(sbx, `http://${b.addr}/`), /not in allowOut/)

    // The SDK's view of the sandbox keeps the names.
    const info = await sbx.getInfo()
    assert.deepEqual(info.network?.allowOut, ['allowed.e2e.test', '*.wild.e2e.test'])
  })

  test('updateNetwork changes the names at once', async () => {
    const sbx = await Sandbox.create('base', { network: { allowOut: ['allowed.e2e.test'], denyOut: [ALL_TRAFFIC] } })
    server.defer(() => sbx.kill())
    assert.equal(await fetchIn(sbx, 'http://allowed.e2e.test/'), 'host=a hosthdr=allowed.e2e.test')
    await sbx.updateNetwork({ allowOut: ['other.e2e.test'], denyOut: [ALL_TRAFFIC] })
    assert.equal(await fetchIn(sbx, 'http://other.e2e.test/'), 'host=b hosthdr=other.e2e.test')
    assert.match(await fetchIn(sbx, 'http://allowed.e2e.test/'), /refused|not in allowOut/)
  })

  test('egressProxy sends the allowed egress through a SOCKS5 proxy', async () => {
    a.lines.length = 0
    const egressProxy = { address: `${a.addr}:1080`, username: 'agent', password: 's3cret' }
    const sbx = await Sandbox.create('base', {
      network: { allowOut: ['allowed.e2e.test'], denyOut: [ALL_TRAFFIC], egressProxy },
    })
    server.defer(() => sbx.kill())
    assert.equal(await fetchIn(sbx, 'http://allowed.e2e.test/'), 'host=a hosthdr=allowed.e2e.test')
    assert.ok(a.lines.includes('socks: allowed.e2e.test:80 user=agent'), JSON.stringify(a.lines))
    // Refused names never reach the proxy.
    assert.match(await fetchIn(sbx, 'http://other.e2e.test/', `--resolve other.e2e.test:80:${b.addr}`), /not in allowOut/)
    assert.ok(!a.lines.some((l) => l.includes('other.e2e.test')), JSON.stringify(a.lines))
    // The SDK shows the proxy without its password.
    const info = await sbx.getInfo()
    assert.deepEqual(info.network?.egressProxy, { address: `${a.addr}:1080`, username: 'agent' })
    // A proxy that does not take the credentials is refused before a sandbox is made.
    await rejectsWith(Sandbox.create('base', { network: { egressProxy: { ...egressProxy, password: 'wrong' } } }),
      SandboxError, 'wrong proxy password')
  })

  test('bad names and names in denyOut are refused', async () => {
    await rejectsWith(Sandbox.create('base', { network: { allowOut: ['*.*.com'], denyOut: [ALL_TRAFFIC] } }), SandboxError, 'two wildcards')
    await rejectsWith(Sandbox.create('base', { network: { denyOut: ['evil.e2e.test'] } }), SandboxError, 'a name in denyOut')
  })

  test('a rule sets a secret into HTTPS requests to its host, and the sandbox never holds it', async () => {
    const value = 'sk-e2e-transform-' + Math.random().toString(36).slice(2)
    const digest = (v) => 'auth-sha256=' + createHash('sha256').update(v).digest('hex')
    await Secret.create('e2e-transform-key', value)
    server.defer(() => Secret.destroy('e2e-transform-key').catch(() => {}))
    const rules = new Map([['api.e2e.test', [{ transform: { headers: { Authorization: `Bearer ${Secret.fill('e2e-transform-key')}` } } }]]])
    const sbx = await Sandbox.create('base', {
      // allowOut from the rules' hosts, as the SDK's selector callback allows.
      network: { allowOut: ({ rules }) => [...rules.keys(), 'plain.e2e.test'], denyOut: [ALL_TRAFFIC], rules },
    })
    server.defer(() => sbx.kill())
    // The sandbox's own trust store holds the node's egress CA: no --cacert.
    const got = await fetchIn(sbx, 'https://api.e2e.test/', "-H 'Authorization: mine'")
    assert.equal(got, `host=c hosthdr=api.e2e.test ${digest('Bearer ' + value)}`)
    // Another host, without rules, is not intercepted: the CA of its own
    // certificate is not in the sandbox's bundle.
    assert.equal(await fetchIn(sbx, 'https://plain.e2e.test/'), 'refused')
    // Nowhere inside: environment, processes' environments, files.
    const inside = await sbx.commands.run(`env; cat /proc/*/environ 2>/dev/null; grep -rl '${value}' /etc /tmp /root /home 2>/dev/null; true`)
    assert.ok(!inside.stdout.includes(value), 'the secret is inside the sandbox')
    const info = await sbx.getInfo()
    assert.ok(JSON.stringify(info.network?.rules ?? {}).includes('api.e2e.test'), JSON.stringify(info.network))

    // A rule naming a secret the team does not have is refused at create.
    await rejectsWith(Sandbox.create('base', {
      network: { rules: { 'api.e2e.test': [{ transform: { headers: { Authorization: Secret.fill('e2e-no-such') } } }] } },
    }), SandboxError, 'an unknown secret')
  })
})
