// Secrets through the unmodified E2B SDK (e2b@2.51): Secret.create,
// getInfo, list (paged), update, exists, destroy and fill, scoped by
// team; values are never answered. Alone and through a gateway.

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { Secret, SecretError, SecretNotFoundError, InvalidArgumentError } from 'e2b'
import { useServer, rejectsWith } from './harness.mjs'

describe('secrets', () => {
  const server = useServer({ before, after })
  const value = 'sk-e2e-9f3Kq27LmZx0'

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

  async function drain(paginator) {
    const out = []
    while (paginator.hasNext) out.push(...(await paginator.nextItems()))
    return out
  }

  test('a secret is made, read, versioned and destroyed, its value never answered', async () => {
    const made = await Secret.create('E2E-OpenAI-Key', value, { metadata: { env: 'test' } })
    server.defer(() => Secret.destroy(made.secretId).catch(() => {}))
    assert.match(made.secretId, /^sec_/)
    assert.equal(made.name, 'e2e-openai-key') // lower-cased, as E2B stores it
    assert.equal(made.version, 1)
    assert.deepEqual(made.metadata, { env: 'test' })
    assert.ok(made.createdAt instanceof Date && !isNaN(made.createdAt))
    assert.ok(!JSON.stringify(made).includes(value))

    for (const ref of [made.secretId, 'e2e-openai-key']) {
      const info = await Secret.getInfo(ref)
      assert.equal(info.secretId, made.secretId)
      assert.ok(!JSON.stringify(info).includes(value))
    }
    assert.equal(await Secret.exists('e2e-openai-key'), true)
    assert.equal(await Secret.exists('e2e-no-such'), false)
    await rejectsWith(Secret.getInfo('e2e-no-such'), SecretNotFoundError, 'an unknown secret')
    await rejectsWith(Secret.create('e2e-openai-key', 'again'), SecretError, 'a taken name')

    const updated = await Secret.update('e2e-openai-key', 'rotated-' + value)
    assert.equal(updated.version, 2)
    assert.deepEqual(updated.metadata, { env: 'test' }, 'metadata kept when not given')
    assert.ok(updated.updatedAt >= made.updatedAt)
    const replaced = await Secret.update(made.secretId, 'v3', { metadata: { env: 'prod' } })
    assert.equal(replaced.version, 3)
    assert.deepEqual(replaced.metadata, { env: 'prod' })
    await rejectsWith(Secret.update('e2e-no-such', 'v'), SecretNotFoundError, 'update of an unknown secret')

    assert.equal(Secret.fill('e2e-openai-key'), '${e2b.secrets.e2e-openai-key}')

    assert.equal(await Secret.destroy(made.secretId), true)
    assert.equal(await Secret.destroy(made.secretId), false)
    assert.equal(await Secret.exists(made.secretId), false)
  })

  test('bad names and values are refused', async () => {
    for (const [name, v, why] of [
      ['sec_reserved', 'v', 'the ID prefix'],
      ['has space', 'v', 'a space'],
      ['x'.repeat(253), 'v', 'over 128 characters'],
      ['e2e-crlf', 'a\r\nX-Injected: 1', 'a line break in the value'],
      ['e2e-empty', '', 'an empty value'],
    ]) {
      await rejectsWith(Secret.create(name, v), SecretError, why)
    }
    // The SDK itself refuses names a placeholder cannot hold.
    assert.throws(() => Secret.fill('a}b'), InvalidArgumentError)
  })

  test('the list pages, and a team sees only its secrets', async () => {
    await admin('POST', '/teams', { teamID: 'sec-team-a' })
    await admin('POST', '/teams', { teamID: 'sec-team-b' })
    const a = await admin('POST', '/api-keys', { teamID: 'sec-team-a' })
    const b = await admin('POST', '/api-keys', { teamID: 'sec-team-b' })
    server.defer(() => admin('DELETE', '/teams/sec-team-a?force=true').catch(() => {}))
    server.defer(() => admin('DELETE', '/teams/sec-team-b?force=true').catch(() => {}))

    const names = ['one', 'two', 'three']
    const mine = []
    for (const n of names) mine.push(await Secret.create(n, value, { apiKey: a.key }))
    // Names are per team.
    const theirs = await Secret.create('one', 'b', { apiKey: b.key })

    const listed = await drain(Secret.list({ apiKey: a.key, limit: 2 }))
    assert.deepEqual(listed.map((s) => s.secretId), mine.map((s) => s.secretId), 'oldest first, over two pages')
    assert.ok(!JSON.stringify(listed).includes(value))

    await rejectsWith(Secret.getInfo(mine[0].secretId, { apiKey: b.key }), SecretNotFoundError, "another team's secret")
    await rejectsWith(Secret.update(mine[0].secretId, 'stolen', { apiKey: b.key }), SecretNotFoundError, "another team's update")
    assert.equal(await Secret.destroy(mine[0].secretId, { apiKey: b.key }), false)
    assert.equal((await Secret.getInfo('one', { apiKey: b.key })).secretId, theirs.secretId)
    assert.equal((await Secret.getInfo('one', { apiKey: a.key })).version, 1, "b's attempts changed nothing")
  })
})
