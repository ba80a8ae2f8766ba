// Filesystem through the E2B SDK: read/write (text, binary, empty, 20 MB,
// gzip, streams, metadata), writeFiles, list, exists, getInfo, makeDir,
// rename, remove, watchDir, signed upload/download URLs, users and errors.

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import {
  Sandbox, FileType, FilesystemEventType, NotFoundError, FileNotFoundError, InvalidArgumentError,
  AuthenticationError, SandboxError,
} from 'e2b'
import { useServer, rejectsWith, eventually } from './harness.mjs'

const sha256 = (buf) => createHash('sha256').update(buf).digest('hex')

// allBytes is every byte value, twice, as binary test data.
const allBytes = new Uint8Array(512).map((_, i) => i % 256)

describe('files', () => {
  const server = useServer({ before, after })

  let sbx
  before(async () => {
    sbx = await Sandbox.create('base', { timeoutMs: 600_000 })
    server.defer(() => sbx.kill())
  })

  describe('read and write', () => {
    test('text round trip; write returns the entry', async () => {
      const info = await sbx.files.write('/tmp/rw/hello.txt', 'hello, wörld ✓\n')
      assert.equal(info.name, 'hello.txt')
      assert.equal(info.path, '/tmp/rw/hello.txt')
      assert.equal(info.type, FileType.FILE)
      assert.equal(await sbx.files.read('/tmp/rw/hello.txt'), 'hello, wörld ✓\n')
      // The sandbox sees the same bytes.
      const r = await sbx.commands.run('cat /tmp/rw/hello.txt')
      assert.equal(r.stdout, 'hello, wörld ✓\n')
    })

    test('writing again overwrites (and truncates)', async () => {
      await sbx.files.write('/tmp/rw/over.txt', 'a long first version')
      await sbx.files.write('/tmp/rw/over.txt', 'short')
      assert.equal(await sbx.files.read('/tmp/rw/over.txt'), 'short')
    })

    test('binary data as ArrayBuffer and Uint8Array, read back as bytes, blob and stream', async () => {
      await sbx.files.write('/tmp/rw/bin1', allBytes.buffer)
      const bytes = await sbx.files.read('/tmp/rw/bin1', { format: 'bytes' })
      assert.ok(bytes instanceof Uint8Array)
      assert.deepEqual(Buffer.from(bytes), Buffer.from(allBytes))

      // A Uint8Array is what most callers have; the SDK takes it as a Blob part.
      await sbx.files.write('/tmp/rw/bin2', new Blob([allBytes]))
      const blob = await sbx.files.read('/tmp/rw/bin2', { format: 'blob' })
      assert.deepEqual(Buffer.from(await blob.arrayBuffer()), Buffer.from(allBytes))

      const stream = await sbx.files.read('/tmp/rw/bin1', { format: 'stream' })
      const chunks = []
      for await (const c of stream) chunks.push(c)
      assert.deepEqual(Buffer.concat(chunks), Buffer.from(allBytes))

      const r = await sbx.commands.run('sha256sum /tmp/rw/bin1 | cut -d" " -f1')
      assert.equal(r.stdout.trim(), sha256(allBytes))
    })

    test('an empty file reads as empty in every format', async () => {
      await sbx.files.write('/tmp/rw/empty', '')
      assert.equal(await sbx.files.read('/tmp/rw/empty'), '')
      assert.equal((await sbx.files.read('/tmp/rw/empty', { format: 'bytes' })).length, 0)
      const r = await sbx.commands.run('stat -c %s /tmp/rw/empty')
      assert.equal(r.stdout.trim(), '0')
    })

    test('a 20 MB file round trips intact', async () => {
      const big = randomBytes(20 * 1024 * 1024)
      const info = await sbx.files.write('/tmp/rw/big.bin', big.buffer.slice(big.byteOffset, big.byteOffset + big.length))
      assert.equal(info.path, '/tmp/rw/big.bin')
      const r = await sbx.commands.run('stat -c %s /tmp/rw/big.bin; sha256sum /tmp/rw/big.bin | cut -d" " -f1')
      assert.equal(r.stdout, `${big.length}\n${sha256(big)}\n`)
      const back = await sbx.files.read('/tmp/rw/big.bin', { format: 'bytes' })
      assert.equal(back.length, big.length)
      assert.equal(sha256(back), sha256(big))
    })

    test('gzip upload and download', async () => {
      const text = 'compress me '.repeat(10_000)
      await sbx.files.write('/tmp/rw/gz.txt', text, { gzip: true })
      assert.equal(await sbx.files.read('/tmp/rw/gz.txt', { gzip: true }), text)
      assert.equal(await sbx.files.read('/tmp/rw/gz.txt'), text)
    })

    test('octet-stream upload and a ReadableStream body', async () => {
      await sbx.files.write('/tmp/rw/octet.txt', 'raw body', { useOctetStream: true })
      assert.equal(await sbx.files.read('/tmp/rw/octet.txt'), 'raw body')
      const stream = new Blob(['streamed ', 'body']).stream()
      await sbx.files.write('/tmp/rw/stream.txt', stream)
      assert.equal(await sbx.files.read('/tmp/rw/stream.txt'), 'streamed body')
    })

    test('a relative path is relative to the user home', async () => {
      const info = await sbx.files.write('relative.txt', 'in home')
      assert.equal(info.path, '/home/user/relative.txt')
      assert.equal(await sbx.files.read('/home/user/relative.txt'), 'in home')
      assert.equal(await sbx.files.read('relative.txt'), 'in home')
    })

    test('metadata is stored with the file and returned by getInfo and list', async () => {
      const info = await sbx.files.write('/tmp/rw/meta.txt', 'm', { metadata: { Owner: 'e2e', purpose: 'test value' } })
      assert.deepEqual(info.metadata, { owner: 'e2e', purpose: 'test value' })
      const stat = await sbx.files.getInfo('/tmp/rw/meta.txt')
      assert.deepEqual(stat.metadata, { owner: 'e2e', purpose: 'test value' })
      const listed = (await sbx.files.list('/tmp/rw')).find((e) => e.name === 'meta.txt')
      assert.deepEqual(listed.metadata, { owner: 'e2e', purpose: 'test value' })
      // As on E2B, a write replaces the metadata: none clears it.
      await sbx.files.write('/tmp/rw/meta.txt', 'again')
      assert.equal((await sbx.files.getInfo('/tmp/rw/meta.txt')).metadata, undefined)
    })
  })

  describe('writeFiles', () => {
    test('writes several files (nested paths) in one request', async () => {
      const infos = await sbx.files.writeFiles([
        { path: '/tmp/multi/a.txt', data: 'A' },
        { path: '/tmp/multi/deep/er/b.bin', data: allBytes.buffer },
        { path: '/tmp/multi/c.txt', data: new Blob(['C']) },
      ])
      assert.deepEqual(infos.map((i) => i.path), ['/tmp/multi/a.txt', '/tmp/multi/deep/er/b.bin', '/tmp/multi/c.txt'])
      assert.deepEqual(infos.map((i) => i.name), ['a.txt', 'b.bin', 'c.txt'])
      assert.equal(await sbx.files.read('/tmp/multi/a.txt'), 'A')
      assert.deepEqual(Buffer.from(await sbx.files.read('/tmp/multi/deep/er/b.bin', { format: 'bytes' })), Buffer.from(allBytes))
      assert.equal(await sbx.files.read('/tmp/multi/c.txt'), 'C')
    })

    test('write with an array is writeFiles', async () => {
      const infos = await sbx.files.write([{ path: '/tmp/multi/x', data: 'x' }, { path: '/tmp/multi/y', data: 'y' }])
      assert.equal(infos.length, 2)
      assert.equal(await sbx.files.read('/tmp/multi/y'), 'y')
    })
  })

  describe('users', () => {
    test('files written by default belong to user, with user-owned parents', async () => {
      await sbx.files.write('/tmp/owned/by/user.txt', 'u')
      const info = await sbx.files.getInfo('/tmp/owned/by/user.txt')
      assert.equal(info.owner, 'user')
      assert.equal(info.group, 'user')
      const dir = await sbx.files.getInfo('/tmp/owned/by')
      assert.equal(dir.owner, 'user')
    })

    test('user root writes root-owned files where user cannot', async () => {
      await sbx.files.write('/root/secret.txt', 'r', { user: 'root' })
      const info = await sbx.files.getInfo('/root/secret.txt', { user: 'root' })
      assert.equal(info.owner, 'root')
      assert.equal(await sbx.files.read('/root/secret.txt', { user: 'root' }), 'r')
    })

    test('relative paths are relative to the chosen user home', async () => {
      const info = await sbx.files.write('rel-root.txt', 'x', { user: 'root' })
      assert.equal(info.path, '/root/rel-root.txt')
    })

    test('an unknown user gives AuthenticationError', async () => {
      await rejectsWith(sbx.files.read('/etc/hostname', { user: 'nosuchuser' }), AuthenticationError, 'read as unknown user')
      await rejectsWith(sbx.files.list('/tmp', { user: 'nosuchuser' }), AuthenticationError, 'list as unknown user')
    })
  })

  describe('list, exists, getInfo', () => {
    before(async () => {
      await sbx.files.writeFiles([
        { path: '/tmp/tree/f1.txt', data: '12345' },
        { path: '/tmp/tree/sub/f2.txt', data: 'x' },
        { path: '/tmp/tree/sub/deeper/f3.txt', data: 'y' },
      ])
      await sbx.commands.run('ln -s /tmp/tree/f1.txt /tmp/tree/link')
    })

    test('list gives the direct entries with types and sizes', async () => {
      const entries = await sbx.files.list('/tmp/tree')
      const byName = Object.fromEntries(entries.map((e) => [e.name, e]))
      assert.deepEqual(Object.keys(byName).sort(), ['f1.txt', 'link', 'sub'])
      assert.equal(byName['f1.txt'].type, FileType.FILE)
      assert.equal(byName['f1.txt'].path, '/tmp/tree/f1.txt')
      assert.equal(byName['f1.txt'].size, 5)
      assert.equal(byName.sub.type, FileType.DIR)
      // Symlinks are typed by their target and name it.
      assert.equal(byName.link.symlinkTarget, '/tmp/tree/f1.txt')
    })

    test('list with depth 3 descends', async () => {
      const entries = await sbx.files.list('/tmp/tree', { depth: 3 })
      const paths = entries.map((e) => e.path).sort()
      assert.deepEqual(paths, [
        '/tmp/tree/f1.txt', '/tmp/tree/link', '/tmp/tree/sub', '/tmp/tree/sub/deeper',
        '/tmp/tree/sub/deeper/f3.txt', '/tmp/tree/sub/f2.txt',
      ])
    })

    test('exists is true for files and dirs, false for missing paths', async () => {
      assert.equal(await sbx.files.exists('/tmp/tree/f1.txt'), true)
      assert.equal(await sbx.files.exists('/tmp/tree/sub'), true)
      assert.equal(await sbx.files.exists('/tmp/tree/nope'), false)
      assert.equal(await sbx.files.exists('/no/such/dir/at/all'), false)
    })

    test('getInfo gives type, size, mode, permissions, owner and time', async () => {
      await sbx.commands.run('chmod 640 /tmp/tree/f1.txt')
      const info = await sbx.files.getInfo('/tmp/tree/f1.txt')
      assert.equal(info.name, 'f1.txt')
      assert.equal(info.path, '/tmp/tree/f1.txt')
      assert.equal(info.type, FileType.FILE)
      assert.equal(info.size, 5)
      assert.equal(info.mode, 0o640)
      assert.equal(info.permissions, '-rw-r-----')
      assert.equal(info.owner, 'user')
      assert.ok(info.modifiedTime instanceof Date)
      assert.ok(Math.abs(info.modifiedTime.getTime() - Date.now()) < 120_000, `modifiedTime ${info.modifiedTime}`)
      const dir = await sbx.files.getInfo('/tmp/tree/sub')
      assert.equal(dir.type, FileType.DIR)
      assert.match(dir.permissions, /^d/)
    })

    test('missing paths give FileNotFoundError', async () => {
      const e1 = await rejectsWith(sbx.files.getInfo('/tmp/tree/nope'), FileNotFoundError, 'getInfo missing')
      assert.ok(e1 instanceof NotFoundError)
      await rejectsWith(sbx.files.list('/tmp/tree/nope'), FileNotFoundError, 'list missing')
      await rejectsWith(sbx.files.read('/tmp/tree/nope'), FileNotFoundError, 'read missing')
      await rejectsWith(sbx.files.read('/tmp/tree/nope', { format: 'bytes' }), NotFoundError, 'read bytes missing')
    })

    test('invalid arguments give InvalidArgumentError', async () => {
      await rejectsWith(sbx.files.read('/tmp/tree/sub'), InvalidArgumentError, 'read a directory')
      await rejectsWith(sbx.files.write('/tmp/tree/sub', 'x'), InvalidArgumentError, 'write onto a directory')
      await rejectsWith(sbx.files.list('/tmp/tree/f1.txt'), InvalidArgumentError, 'list a file')
      await rejectsWith(sbx.files.list('/tmp/tree', { depth: 0 }), InvalidArgumentError, 'list depth 0 (client side)')
    })
  })

  describe('makeDir, rename, remove', () => {
    test('makeDir creates parents; true then false when it exists', async () => {
      assert.equal(await sbx.files.makeDir('/tmp/mk/a/b/c'), true)
      assert.equal(await sbx.files.makeDir('/tmp/mk/a/b/c'), false)
      const info = await sbx.files.getInfo('/tmp/mk/a/b/c')
      assert.equal(info.type, FileType.DIR)
      assert.equal(info.owner, 'user')
    })

    test('makeDir onto a file fails', async () => {
      await sbx.files.write('/tmp/mk/file', 'f')
      await rejectsWith(sbx.files.makeDir('/tmp/mk/file/sub'), SandboxError, 'makeDir under a file')
    })

    test('rename moves a file and returns the new entry', async () => {
      await sbx.files.write('/tmp/mv/old.txt', 'moving')
      const info = await sbx.files.rename('/tmp/mv/old.txt', '/tmp/mv/new.txt')
      assert.equal(info.path, '/tmp/mv/new.txt')
      assert.equal(info.name, 'new.txt')
      assert.equal(info.type, FileType.FILE)
      assert.equal(await sbx.files.exists('/tmp/mv/old.txt'), false)
      assert.equal(await sbx.files.read('/tmp/mv/new.txt'), 'moving')
    })

    test('rename moves a directory', async () => {
      await sbx.files.write('/tmp/mv/dir1/inner.txt', 'i')
      const info = await sbx.files.rename('/tmp/mv/dir1', '/tmp/mv/dir2')
      assert.equal(info.type, FileType.DIR)
      assert.equal(await sbx.files.read('/tmp/mv/dir2/inner.txt'), 'i')
    })

    test('rename of a missing path gives FileNotFoundError', async () => {
      await rejectsWith(sbx.files.rename('/tmp/mv/missing', '/tmp/mv/x'), FileNotFoundError, 'rename missing')
    })

    test('remove deletes files and whole directories; a missing path is fine', async () => {
      await sbx.files.write('/tmp/rm/d/e/f.txt', 'f')
      await sbx.files.write('/tmp/rm/g.txt', 'g')
      await sbx.files.remove('/tmp/rm/g.txt')
      assert.equal(await sbx.files.exists('/tmp/rm/g.txt'), false)
      await sbx.files.remove('/tmp/rm/d')
      assert.equal(await sbx.files.exists('/tmp/rm/d'), false)
      await sbx.files.remove('/tmp/rm/never-existed')
    })
  })

  describe('watchDir', () => {
    test('reports create, write, rename and remove with relative names', async () => {
      await sbx.files.makeDir('/tmp/watch')
      const events = []
      let exited = false
      const handle = await sbx.files.watchDir('/tmp/watch', (e) => { events.push(e) }, {
        onExit: () => { exited = true },
      })
      try {
        await sbx.files.write('/tmp/watch/a.txt', 'one')
        await eventually(() => assert.ok(events.some((e) => e.name === 'a.txt' && e.type === FilesystemEventType.CREATE),
          `no create event: ${JSON.stringify(events)}`))
        await sbx.commands.run('echo more >> /tmp/watch/a.txt')
        await eventually(() => assert.ok(events.some((e) => e.name === 'a.txt' && e.type === FilesystemEventType.WRITE),
          `no write event: ${JSON.stringify(events)}`))
        await sbx.files.rename('/tmp/watch/a.txt', '/tmp/watch/b.txt')
        await eventually(() => assert.ok(events.some((e) => e.name === 'a.txt' && e.type === FilesystemEventType.RENAME),
          `no rename event: ${JSON.stringify(events)}`))
        await sbx.files.remove('/tmp/watch/b.txt')
        await eventually(() => assert.ok(events.some((e) => e.name === 'b.txt' && e.type === FilesystemEventType.REMOVE),
          `no remove event: ${JSON.stringify(events)}`))
        await sbx.commands.run('touch /tmp/watch/c && chmod 600 /tmp/watch/c')
        await eventually(() => assert.ok(events.some((e) => e.name === 'c' && e.type === FilesystemEventType.CHMOD),
          `no chmod event: ${JSON.stringify(events)}`))
      } finally {
        await handle.stop()
      }
      const count = events.length
      await sbx.files.write('/tmp/watch/after-stop', 'x')
      await sleep(500)
      assert.equal(events.length, count, 'events after stop')
      assert.equal(exited, true, 'onExit not called after stop')
    })

    test('recursive watch sees nested changes, with entries when asked', async () => {
      await sbx.files.makeDir('/tmp/watchr/sub')
      const events = []
      const handle = await sbx.files.watchDir('/tmp/watchr', (e) => { events.push(e) }, { recursive: true, includeEntry: true })
      try {
        await sbx.files.write('/tmp/watchr/sub/nested.txt', 'n')
        await eventually(() => {
          const e = events.find((x) => x.name === 'sub/nested.txt' && x.type === FilesystemEventType.CREATE)
          assert.ok(e, `no nested create event: ${JSON.stringify(events)}`)
          assert.equal(e.entry?.path, '/tmp/watchr/sub/nested.txt')
        })
      } finally {
        await handle.stop()
      }
    })

    test('a non-recursive watch ignores nested changes', async () => {
      await sbx.files.makeDir('/tmp/watchn/sub')
      const events = []
      const handle = await sbx.files.watchDir('/tmp/watchn', (e) => { events.push(e) })
      try {
        await sbx.files.write('/tmp/watchn/sub/nested.txt', 'n')
        await sbx.files.write('/tmp/watchn/top.txt', 't')
        await eventually(() => assert.ok(events.some((e) => e.name === 'top.txt')))
        assert.ok(!events.some((e) => e.name.includes('nested')), `nested event seen: ${JSON.stringify(events)}`)
      } finally {
        await handle.stop()
      }
    })

    test('the watch ends at its timeoutMs and calls onExit', async () => {
      await sbx.files.makeDir('/tmp/watcht')
      let exitedWith
      const exited = new Promise((resolve) => {
        sbx.files.watchDir('/tmp/watcht', () => {}, { timeoutMs: 1000, onExit: (err) => { exitedWith = err; resolve() } })
      })
      await Promise.race([exited, sleep(10_000).then(() => { throw new Error('watch did not end at its timeout') })])
      assert.ok(exitedWith === undefined || exitedWith instanceof SandboxError, `onExit(${exitedWith})`)
    })

    test('watching a missing dir gives FileNotFoundError; a file gives InvalidArgumentError', async () => {
      await rejectsWith(sbx.files.watchDir('/tmp/no-such-watch', () => {}), NotFoundError, 'watch missing')
      await sbx.files.write('/tmp/watch-file', 'x')
      await rejectsWith(sbx.files.watchDir('/tmp/watch-file', () => {}), InvalidArgumentError, 'watch a file')
    })
  })

  describe('signed URLs used without the SDK', () => {
    // Plain fetch sends none of the SDK's headers (no E2b-Sandbox-Id, no
    // access token): the server must find the sandbox from the signature.
    test('downloadUrl serves the file to a plain GET', async () => {
      await sbx.files.write('/tmp/url/down.txt', 'downloaded via url')
      const url = await sbx.downloadUrl('/tmp/url/down.txt')
      const u = new URL(url)
      assert.equal(u.pathname, '/files')
      assert.ok(u.searchParams.get('signature')?.startsWith('v1_'), `unsigned url ${url}`)
      const res = await fetch(url)
      assert.equal(res.status, 200)
      assert.equal(await res.text(), 'downloaded via url')
    })

    test('uploadUrl takes a plain multipart POST', async () => {
      const url = await sbx.uploadUrl('/tmp/url/up.txt')
      const form = new FormData()
      form.append('file', new Blob(['uploaded via url']), 'up.txt')
      const res = await fetch(url, { method: 'POST', body: form })
      assert.equal(res.status, 200, await res.clone().text())
      assert.equal(await sbx.files.read('/tmp/url/up.txt'), 'uploaded via url')
    })

    test('uploadUrl without a path uses the filename of the part', async () => {
      const url = await sbx.uploadUrl()
      const form = new FormData()
      form.append('file', new Blob(['named by part']), '/tmp/url/by-part.txt')
      const res = await fetch(url, { method: 'POST', body: form })
      assert.equal(res.status, 200, await res.clone().text())
      assert.equal(await sbx.files.read('/tmp/url/by-part.txt'), 'named by part')
    })

    test('URLs for user root and with an expiration', async () => {
      const up = await sbx.uploadUrl('/root/url-root.txt', { user: 'root', useSignatureExpiration: 60 })
      assert.ok(new URL(up).searchParams.get('signature_expiration'))
      const form = new FormData()
      form.append('file', new Blob(['root via url']), 'x')
      assert.equal((await fetch(up, { method: 'POST', body: form })).status, 200)
      const down = await sbx.downloadUrl('/root/url-root.txt', { user: 'root', useSignatureExpiration: 60 })
      const res = await fetch(down)
      assert.equal(res.status, 200)
      assert.equal(await res.text(), 'root via url')
    })

    test('a binary file through the URLs', async () => {
      const data = randomBytes(1024 * 1024)
      const form = new FormData()
      form.append('file', new Blob([data]), 'bin')
      const up = await sbx.uploadUrl('/tmp/url/bin')
      assert.equal((await fetch(up, { method: 'POST', body: form })).status, 200)
      const res = await fetch(await sbx.downloadUrl('/tmp/url/bin'))
      assert.equal(sha256(Buffer.from(await res.arrayBuffer())), sha256(data))
    })

    test('a tampered, expired or mismatched signature is refused with 401', async () => {
      await sbx.files.write('/tmp/url/guarded.txt', 'guarded')
      const url = new URL(await sbx.downloadUrl('/tmp/url/guarded.txt'))

      const tampered = new URL(url)
      tampered.searchParams.set('signature', 'v1_' + 'A'.repeat(43))
      assert.equal((await fetch(tampered)).status, 401)

      // A signature for another path does not open this one.
      const other = new URL(url)
      other.searchParams.set('path', '/etc/shadow')
      assert.equal((await fetch(other)).status, 401)

      // A read signature does not allow a write.
      const form = new FormData()
      form.append('file', new Blob(['overwrite']), 'x')
      assert.equal((await fetch(url, { method: 'POST', body: form })).status, 401)
      assert.equal(await sbx.files.read('/tmp/url/guarded.txt'), 'guarded')

      const expiring = await sbx.downloadUrl('/tmp/url/guarded.txt', { useSignatureExpiration: 1 })
      await sleep(2500)
      const expired = await fetch(expiring)
      assert.equal(expired.status, 401)
      assert.deepEqual(await expired.json(), { code: 401, message: 'signature is already expired' })
    })

    test('the URLs stop working when the sandbox is killed', async () => {
      const other = await Sandbox.create('base', { timeoutMs: 60_000 })
      await other.files.write('/tmp/x', 'x')
      const url = await other.downloadUrl('/tmp/x')
      assert.equal((await fetch(url)).status, 200)
      await other.kill()
      const res = await fetch(url)
      assert.ok([401, 502].includes(res.status), `status ${res.status} after kill`)
    })
  })
})
