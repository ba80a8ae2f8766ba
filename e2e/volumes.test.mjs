// Volumes through the unmodified E2B SDK (e2b@2.51): Volume.create, list,
// getInfo, destroy, and the content API without a sandbox (read, write,
// list, makeDir, stat, metadata, remove), scoped by team. Alone and
// through a gateway (E2B_VOLUME_API_URL points at either).

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, SandboxError, Volume, VolumeFileType, VolumeNotFoundError, VolumePathNotFoundError, VolumeError, AuthenticationError } from 'e2b'
import { useServer, rejectsWith } from './harness.mjs'

describe('volumes', () => {
  // The cluster run keeps its nodes' volumes in volume pools (btrfs,
  // sized volumes, copies as snapshots), as does a deployment with
  // AENV_E2E_VOLUME_POOL=1; the single server's are directories (copies
  // as overlays): the SDK drives both.
  const pooled = Boolean(process.env.AENV_E2E_DATABASE_URL) || process.env.AENV_E2E_VOLUME_POOL === '1'
  const server = useServer({ before, after, volumePoolGB: pooled ? 1 : 0 })

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

  test('a volume is made, filled, read and destroyed without a sandbox', async () => {
    const vol = await Volume.create('e2e-data')
    server.defer(() => Volume.destroy(vol.volumeId).catch(() => {}))
    assert.match(vol.volumeId, /^vol-/)
    assert.equal(vol.name, 'e2e-data')

    const listed = await Volume.list()
    assert.ok(listed.some((v) => v.volumeId === vol.volumeId && v.name === 'e2e-data'), JSON.stringify(listed))
    const info = await Volume.getInfo(vol.volumeId)
    assert.equal(info.name, 'e2e-data')
    assert.equal(info.token, vol.token)
    // A second volume of the same name in the team is refused.
    await rejectsWith(Volume.create('e2e-data'), VolumeError, 'a taken name')

    const written = await vol.writeFile('/dir/hello.txt', 'hello volume\n', { force: true, mode: 0o640 })
    assert.equal(written.type, VolumeFileType.FILE)
    assert.equal(written.path, '/dir/hello.txt')
    assert.equal(written.size, 13)
    assert.equal(written.mode & 0o777, 0o640)
    assert.equal(await vol.readFile('/dir/hello.txt'), 'hello volume\n')
    const bytes = new Uint8Array(256 * 1024).map((_, i) => i % 251)
    await vol.writeFile('/dir/blob.bin', bytes)
    assert.deepEqual(await vol.readFile('/dir/blob.bin', { format: 'bytes' }), bytes)

    const made = await vol.makeDir('/dir/sub')
    assert.equal(made.type, VolumeFileType.DIRECTORY)
    const entries = await vol.list('/dir')
    assert.deepEqual(entries.map((e) => e.name), ['blob.bin', 'hello.txt', 'sub'])
    assert.ok(entries[0].mtime instanceof Date && !isNaN(entries[0].mtime))
    const deep = await vol.list('/', { depth: 2 })
    assert.ok(deep.some((e) => e.path === '/dir/sub'), JSON.stringify(deep.map((e) => e.path)))

    const changed = await vol.updateMetadata('/dir/hello.txt', { mode: 0o600, uid: 1000, gid: 1000 })
    assert.equal(changed.mode & 0o777, 0o600)
    assert.equal(changed.uid, 1000)
    assert.equal((await vol.getInfo('/dir/hello.txt')).gid, 1000)
    assert.equal(await vol.exists('/dir/nope'), false)

    await rejectsWith(vol.readFile('/dir/nope'), VolumePathNotFoundError, 'a missing file')
    await rejectsWith(vol.writeFile('/missing/parent.txt', 'x'), VolumePathNotFoundError, 'a missing parent without force')
    // Paths stay inside the volume.
    await rejectsWith(vol.readFile('/../../../etc/passwd'), VolumeError, 'a path out of the volume')

    await vol.remove('/dir')
    assert.equal(await vol.exists('/dir'), false)

    assert.equal(await Volume.destroy(vol.volumeId), true)
    assert.equal(await Volume.destroy(vol.volumeId), false)
    await rejectsWith(Volume.getInfo(vol.volumeId), VolumeNotFoundError, 'a destroyed volume')
    // Its token is no longer good.
    await rejectsWith(vol.readFile('/anything'), AuthenticationError, "a destroyed volume's content")
  })

  test("two sandboxes mount one volume and see each other's writes; a mounted volume is not destroyed", async () => {
    const vol = await Volume.create('e2e-mounted')
    server.defer(() => Volume.destroy(vol.volumeId).catch(() => {}))
    await vol.writeFile('/seed.txt', 'seeded')

    // An unknown volume is refused before anything is made.
    const before = (await Sandbox.list().nextItems()).length
    await rejectsWith(Sandbox.create('base', { volumeMounts: { '/mnt/x': 'no-such-volume' } }), SandboxError, 'an unknown volume')
    assert.equal((await Sandbox.list().nextItems()).length, before)

    const writer = await Sandbox.create('base', { volumeMounts: { '/mnt/data': vol } })
    server.defer(() => writer.kill().catch(() => {}))
    const reader = await Sandbox.create('base', { volumeMounts: { '/mnt/ro': 'e2e-mounted' } })
    server.defer(() => reader.kill().catch(() => {}))
    assert.deepEqual((await writer.getInfo()).volumeMounts, [{ name: 'e2e-mounted', path: '/mnt/data' }])

    assert.equal((await writer.commands.run('cat /mnt/data/seed.txt')).stdout, 'seeded')
    await writer.files.write('/mnt/data/from-writer.txt', 'written inside')
    assert.equal(await vol.readFile('/from-writer.txt'), 'written inside')
    assert.equal(await reader.files.read('/mnt/ro/from-writer.txt'), 'written inside')

    // Pause and resume keep the mount; what was written meanwhile is there.
    assert.equal(await writer.pause(), true)
    await vol.writeFile('/while-paused.txt', 'written while paused')
    const resumed = await Sandbox.connect(writer.sandboxId)
    assert.equal((await resumed.commands.run('cat /mnt/data/from-writer.txt /mnt/data/while-paused.txt')).stdout,
      'written insidewritten while paused')

    // The volume outlives the sandbox; while mounted it is not destroyed.
    const res = await fetch(server.url + '/volumes/' + vol.volumeId, { method: 'DELETE', headers: { 'X-API-Key': server.apiKey } })
    assert.equal(res.status, 409)
    assert.match(await res.text(), new RegExp(writer.sandboxId))
    await writer.kill()
    await reader.kill()
    assert.equal(await vol.readFile('/from-writer.txt'), 'written inside')
    assert.equal(await Volume.destroy(vol.volumeId), true)
  })

  test('a read-only mount refuses writes, whoever writes', async () => {
    const vol = await Volume.create('e2e-readonly')
    server.defer(() => Volume.destroy(vol.volumeId).catch(() => {}))
    const res = await fetch(server.url + '/sandboxes', {
      method: 'POST',
      headers: { 'X-API-Key': server.apiKey, 'Content-Type': 'application/json' },
      body: JSON.stringify({ templateID: 'base', volumeMounts: [{ name: 'e2e-readonly', path: '/ro', readOnly: true }] }),
    })
    assert.equal(res.status, 201)
    const sbx = await Sandbox.connect((await res.json()).sandboxID)
    server.defer(() => sbx.kill().catch(() => {}))
    const out = await sbx.commands.run('touch /ro/x 2>&1; echo $?', { user: 'root' })
    assert.match(out.stdout, /Read-only file system/)
    await sbx.kill()
  })

  test("a fork in copy mode gives each child its own copy of the parent's volume", async () => {
    const vol = await Volume.create('e2e-repo')
    server.defer(() => Volume.destroy(vol.volumeId).catch(() => {}))
    await vol.writeFile('/main.txt', 'base', { uid: 1000, gid: 1000 })
    const parent = await Sandbox.create('base', { volumeMounts: { '/repo': vol } })
    server.defer(() => parent.kill().catch(() => {}))
    const res = await admin('POST', `/sandboxes/${parent.sandboxId}/fork`, { count: 2, volumes: { '/repo': 'copy' } })
    const kids = await Promise.all(res.map((r) => {
      assert.ok(r.sandbox, JSON.stringify(r))
      return Sandbox.connect(r.sandbox.sandboxID)
    }))
    for (const k of kids) server.defer(() => k.kill().catch(() => {}))
    for (const k of kids) await k.commands.run(`echo -n ${k.sandboxId} > /repo/main.txt`)
    await parent.commands.run('echo -n parent > /repo/main.txt')
    for (const k of kids) assert.equal(await k.files.read('/repo/main.txt'), k.sandboxId)
    assert.equal(await vol.readFile('/main.txt'), 'parent')
    const copies = (await Volume.list()).filter((v) => v.name.startsWith('e2e-repo-copy-'))
    assert.equal(copies.length, 2, JSON.stringify(copies))
    for (const k of kids) await k.kill()
    for (const c of copies) assert.equal(await Volume.destroy(c.volumeId), true)
  })

  test("a volume's size bounds its writes in a volume pool, and is refused without one", async () => {
    const res = await fetch(server.url + '/volumes', {
      method: 'POST',
      headers: { 'X-API-Key': server.apiKey, 'Content-Type': 'application/json' },
      body: JSON.stringify({ name: 'e2e-sized', sizeMB: 16 }),
    })
    if (!pooled) {
      assert.equal(res.status, 400)
      assert.match(await res.text(), /--volume-pool-gb/)
      return
    }
    assert.equal(res.status, 201)
    const made = await res.json()
    assert.equal(made.sizeMB, 16)
    const vol = await Volume.connect(made.volumeID)
    server.defer(() => Volume.destroy(vol.volumeId).catch(() => {}))
    await vol.writeFile('/kept.bin', new Uint8Array(8 << 20))
    // The content API: refused past the size (507, as the answer, not a
    // reset connection), and the old file stays. The refusal comes before
    // the upload has all arrived: its connection is closed after it, and
    // the calls after it go on others.
    const full = await rejectsWith(vol.writeFile('/kept.bin', new Uint8Array(20 << 20)), VolumeError, 'a write past the size')
    assert.match(full.message, /no space left on the volume/)
    assert.equal((await vol.getInfo('/kept.bin')).size, 8 << 20)
    // Inside a sandbox: the quota, whoever writes.
    const sbx = await Sandbox.create('base', { volumeMounts: { '/data': vol } })
    server.defer(() => sbx.kill().catch(() => {}))
    const out = await sbx.commands.run('dd if=/dev/zero of=/data/more bs=1M count=16 conv=fsync 2>&1; echo exit=$?', { user: 'root' })
    assert.match(out.stdout, /quota/i)
    assert.doesNotMatch(out.stdout, /exit=0/)
    await sbx.kill()
  })

  test("a team sees only its volumes, and a wrong token reads nothing", async () => {
    await admin('POST', '/teams', { teamID: 'vol-team-a' })
    await admin('POST', '/teams', { teamID: 'vol-team-b' })
    const a = await admin('POST', '/api-keys', { teamID: 'vol-team-a' })
    const b = await admin('POST', '/api-keys', { teamID: 'vol-team-b' })
    const va = await Volume.create('shared-name', { apiKey: a.key })
    server.defer(() => Volume.destroy(va.volumeId, { apiKey: a.key }).catch(() => {}))
    // Names are per team.
    const vb = await Volume.create('shared-name', { apiKey: b.key })
    server.defer(() => Volume.destroy(vb.volumeId, { apiKey: b.key }).catch(() => {}))
    await va.writeFile('/secret.txt', 'team a only')

    assert.deepEqual((await Volume.list({ apiKey: b.key })).map((v) => v.volumeId), [vb.volumeId])
    await rejectsWith(Volume.getInfo(va.volumeId, { apiKey: b.key }), VolumeNotFoundError, "another team's volume")
    assert.equal(await Volume.destroy(va.volumeId, { apiKey: b.key }), false)

    // B's token does not open A's volume.
    const forged = new Volume(va.volumeId, va.name, vb.token)
    await rejectsWith(forged.readFile('/secret.txt'), AuthenticationError, "another volume's token")
    assert.equal(await va.readFile('/secret.txt'), 'team a only')

    // A team with volumes is not deleted, force or not: its volumes (and
    // their tokens) go first, one by one.
    const res = await fetch(server.url + '/teams/vol-team-b?force=true', { method: 'DELETE', headers: { 'X-API-Key': server.apiKey } })
    assert.equal(res.status, 409, await res.text())
    assert.equal(await Volume.destroy(vb.volumeId, { apiKey: b.key }), true)
    await admin('DELETE', '/teams/vol-team-b')
  })
})
