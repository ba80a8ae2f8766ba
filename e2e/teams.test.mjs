// Teams through the unmodified E2B SDK: each team's key sees and reaches
// only its own sandboxes, another team's ID is "not found", and a revoked
// key is an AuthenticationError. Alone and through a gateway.

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, NotFoundError, AuthenticationError, RateLimitError } from 'e2b'
import { useServer, eventually, rejectsWith } from './harness.mjs'

describe('teams', () => {
  const server = useServer({ before, after })

  // admin calls the server's own API with the operator's key.
  async function admin(method, path, body) {
    const res = await fetch(server.url + path, {
      method,
      headers: { 'X-API-Key': server.apiKey, 'Content-Type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    })
    const text = await res.text()
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`)
    return text ? JSON.parse(text) : undefined
  }

  async function team(name, maxSandboxes = 0) {
    await admin('POST', '/teams', { teamID: name, maxSandboxes })
    return admin('POST', '/api-keys', { teamID: name, name: `${name}-sdk` })
  }

  async function listIds(apiKey) {
    const out = []
    const paginator = Sandbox.list({ apiKey })
    while (paginator.hasNext) out.push(...(await paginator.nextItems()).map((s) => s.sandboxId))
    return out
  }

  test("a team's key reaches only its team's sandboxes", async () => {
    const a = await team('sdk-a')
    const b = await team('sdk-b')
    const sbxA = await Sandbox.create('base', { apiKey: a.key, timeoutMs: 120_000 })
    server.defer(() => sbxA.kill().catch(() => {}))
    const sbxB = await Sandbox.create('base', { apiKey: b.key, timeoutMs: 120_000 })
    server.defer(() => sbxB.kill().catch(() => {}))

    assert.deepEqual(await listIds(a.key), [sbxA.sandboxId])
    assert.deepEqual(await listIds(b.key), [sbxB.sandboxId])
    await rejectsWith(Sandbox.connect(sbxA.sandboxId, { apiKey: b.key }), NotFoundError, "connect to another team's sandbox")
    await rejectsWith(Sandbox.getInfo(sbxA.sandboxId, { apiKey: b.key }), NotFoundError, "another team's sandbox info")
    assert.equal(await Sandbox.kill(sbxA.sandboxId, { apiKey: b.key }), false)

    // A's sandbox is untouched, and A's key works it as before.
    const again = await Sandbox.connect(sbxA.sandboxId, { apiKey: a.key })
    assert.equal((await again.commands.run('echo mine')).stdout, 'mine\n')

    // A revoked key is refused as E2B refuses a bad key.
    await admin('DELETE', `/api-keys/${b.id}`)
    await eventually(() => rejectsWith(Sandbox.create('base', { apiKey: b.key }), AuthenticationError, 'revoked key'), { timeoutMs: 5_000 })
    assert.deepEqual(await listIds(a.key), [sbxA.sandboxId])
  })

  test("a team at its limit gets RateLimitError until it makes room", async () => {
    const c = await team('sdk-capped', 1)
    const first = await Sandbox.create('base', { apiKey: c.key, timeoutMs: 120_000 })
    server.defer(() => first.kill().catch(() => {}))
    const err = await rejectsWith(Sandbox.create('base', { apiKey: c.key }), RateLimitError, 'create over the limit')
    assert.match(err.message, /limit of 1/)
    await first.kill()
    const second = await Sandbox.create('base', { apiKey: c.key, timeoutMs: 120_000 })
    server.defer(() => second.kill().catch(() => {}))
    assert.equal((await second.commands.run('echo room')).stdout, 'room\n')
  })

  test("a team's memory limit sums its sandboxes' memory", async () => {
    const m = await team('sdk-memory')
    const first = await Sandbox.create('base', { apiKey: m.key, timeoutMs: 120_000 })
    server.defer(() => first.kill().catch(() => {}))
    const { memoryMB, cpuCount } = await Sandbox.getInfo(first.sandboxId, { apiKey: m.key })
    assert.ok(memoryMB > 0 && cpuCount > 0, `memoryMB ${memoryMB}, cpuCount ${cpuCount}`)
    // Room for exactly the one it has.
    const limits = await admin('PATCH', '/teams/sdk-memory', { maxMemoryMB: memoryMB })
    assert.equal(limits.maxMemoryMB, memoryMB)
    const err = await rejectsWith(Sandbox.create('base', { apiKey: m.key }), RateLimitError, 'create over the memory limit')
    assert.match(err.message, /MiB of sandbox memory/)
    await admin('PATCH', '/teams/sdk-memory', { maxMemoryMB: 2 * memoryMB })
    const second = await Sandbox.create('base', { apiKey: m.key, timeoutMs: 120_000 })
    server.defer(() => second.kill().catch(() => {}))
    assert.equal((await second.commands.run('echo fits')).stdout, 'fits\n')
  })
})
