import { before, after, describe, test } from 'node:test'
import http from 'node:http'
import { Sandbox } from 'e2b'
import { useServer } from './harness.mjs'

// startAndDrop sends a Start for cmd, waits for the end-stream frame, and
// destroys the socket at once (an abrupt client disconnect at stream end).
function startAndDrop(server, sbx, cmd) {
  const body = Buffer.from(JSON.stringify({ process: { cmd: '/bin/bash', args: ['-l', '-c', cmd] }, stdin: false }))
  const env = Buffer.alloc(5); env.writeUInt32BE(body.length, 1)
  return new Promise((resolve, reject) => {
    const req = http.request(server.url + '/process.Process/Start', { method: 'POST', agent: false, headers: {
      'content-type': 'application/connect+json', 'connect-protocol-version': '1', 'connect-timeout-ms': '60000',
      'e2b-sandbox-id': sbx.sandboxId, 'e2b-sandbox-port': '49983', 'x-access-token': sbx.envdAccessToken } }, (res) => {
      let got = Buffer.alloc(0)
      res.on('data', (c) => { got = Buffer.concat([got, c]); if (got.includes(Buffer.from([2, 0, 0, 0, 2]))) { req.destroy(); resolve(got.length) } })
      res.on('error', () => {})
    })
    req.on('error', () => {})
    req.end(Buffer.concat([env, body]))
  })
}

describe('repro', () => {
  const server = useServer({ before, after })
  test('abrupt disconnect at stream end, then another Start', async () => {
    let hangs = 0
    for (let s = 0; s < 5; s++) {
      const sbx = await Sandbox.create('base', { timeoutMs: 120_000 })
      for (let i = 0; i < 4; i++) {
        await startAndDrop(server, sbx, 'echo out; echo err >&2')
        const t0 = Date.now()
        try { await sbx.commands.run('echo next', { timeoutMs: 4000 }) } catch (e) { hangs++; console.log(`sandbox ${s} iter ${i}: ${e.constructor.name} after ${Date.now() - t0} ms`) }
      }
      await sbx.kill()
    }
    console.log({ hangs })
  })
})
