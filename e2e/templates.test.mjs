// Template builds through the E2B SDK: Template().fromBaseImage() with
// run, copy, env, workdir and user steps and a start command with a ready
// check, built by Template.build, then sandboxes created from it. No step
// needs the network (the suite runs offline): E2B's base image resolves
// to aenv's base template. Template().fromDockerfile() builds the same
// kinds of steps from fixtures/dockerfile/Dockerfile.

import { before, after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { Sandbox, Template, BuildError } from 'e2b'
import { useServer, rejectsWith, eventually } from './harness.mjs'

const here = path.dirname(fileURLToPath(import.meta.url))
const fixture = (p) => fs.readFileSync(path.join(here, 'fixtures', 'template', p), 'utf8')

const alias = 'e2e-app'
const port = 8080

// app is the template under test; marker changes one step.
function app(marker) {
  return Template()
    .fromBaseImage()
    .setEnvs({ GREETING: 'hello from env' })
    .runCmd('echo step-one-output && mkdir -p /opt/stamp && date +%s%N > /opt/stamp/built', { user: 'root' })
    // A slow step: its result is kept, so later builds start after it.
    .runCmd('sleep 1.5 && date +%s%N > /opt/stamp/slow', { user: 'root' })
    .setWorkdir('/home/user/app')
    .copy('fixtures/template/hello.txt', 'hello.txt')
    .copy('fixtures/template/site', 'site/')
    .setUser('root')
    .runCmd('id -un > /opt/stamp/step-user')
    .setUser('user')
    .runCmd(`echo ${marker} > marker.txt && echo "$GREETING" > greeting.txt && id -un > whoami.txt`)
    .setStartCmd(`python3 -m http.server ${port} --directory /home/user/app/site`,
      `curl -sf http://127.0.0.1:${port}/index.html`)
}

async function build(template, opts = {}) {
  const logs = []
  const began = Date.now()
  const info = await Template.build(template, alias, { onBuildLogs: (e) => logs.push(e.message), ...opts })
  return { info, logs, ms: Date.now() - began }
}

async function run(sbx, cmd, opts) {
  return (await sbx.commands.run(cmd, opts)).stdout.trim()
}

describe('templates', () => {
  const server = useServer({ before, after })
  const created = []
  const track = (sbx) => { created.push(sbx); return sbx }
  before(() => {
    server.defer(() => Promise.all(created.map((s) => s.kill().catch(() => {}))))
  })

  let first
  test('builds from the base image with every offline step kind', async () => {
    assert.equal(await Template.exists(alias), false)
    first = await build(app('v1'))
    console.log(`cold build: ${first.ms} ms`)
    assert.equal(first.info.templateId, alias)
    const text = first.logs.join('\n')
    assert.match(text, /step-one-output/, 'step output reaches the SDK logger')
    assert.match(text, /\[1\/10\] ENV GREETING=hello from env/)
    assert.doesNotMatch(text, /CACHED/)
    assert.equal(await Template.exists(alias), true)
  })

  test('a sandbox from the template has its files, env, users and running process', async () => {
    const began = Date.now()
    const sbx = track(await Sandbox.create(alias))
    console.log(`create from built template: ${Date.now() - began} ms`)
    assert.equal(await sbx.files.read('/home/user/app/hello.txt'), fixture('hello.txt'))
    assert.equal(await sbx.files.read('/home/user/app/site/index.html'), fixture('site/index.html'))
    assert.equal(await sbx.files.read('/home/user/app/site/css/style.css'), fixture('site/css/style.css'))
    assert.equal(await run(sbx, 'cat /home/user/app/marker.txt'), 'v1')
    assert.equal(await run(sbx, 'cat /home/user/app/greeting.txt'), 'hello from env')
    assert.equal(await run(sbx, 'echo "$GREETING"'), 'hello from env', 'ENV reaches sandboxes')
    assert.equal(await run(sbx, 'cat /opt/stamp/step-user'), 'root')
    assert.equal(await run(sbx, 'cat /home/user/app/whoami.txt'), 'user')
    assert.equal(await run(sbx, 'stat -c %U /home/user/app/hello.txt /home/user/app/site/css/style.css'),
      'user\nuser', 'copies belong to the user')
    // The start command was snapshotted running: it answers at once.
    assert.equal(await run(sbx, `curl -sf http://127.0.0.1:${port}/index.html`), fixture('site/index.html').trim())
    assert.match(await run(sbx, 'pgrep -f "http.server" || true'), /\d+/)
  })

  test('an unchanged rebuild reuses the template and says so', async () => {
    const stamp = await readStamp()
    const again = await build(app('v1'))
    console.log(`cached build: ${again.ms} ms`)
    const cached = again.logs.filter((m) => m.startsWith('CACHED'))
    assert.ok(cached.length >= 9, `every step logged as cached:\n${again.logs.join('\n')}`)
    assert.equal(await readStamp(), stamp, 'the template was not rebuilt')
  })

  test('a changed step reruns from there; the steps before it are reused', async () => {
    const stamp = await readStamp()
    const changed = await build(app('v2'))
    console.log(`rebuild with the last step changed: ${changed.ms} ms`)
    const text = changed.logs.join('\n')
    assert.match(text, /CACHED \[3\/10\] RUN sleep 1.5/, text)
    // Steps are cached when they took long enough; on a loaded machine a
    // later one may have too, so the build resumes after the last cached
    // step, whichever it is, and runs every step from there.
    const cachedUpTo = Math.max(...[...text.matchAll(/CACHED \[(\d+)\/10\]/g)].map((m) => Number(m[1])))
    assert.ok(cachedUpTo >= 3 && cachedUpTo < 10, `cached up to step ${cachedUpTo}:\n${text}`)
    for (let step = cachedUpTo + 1; step <= 10; step++) {
      assert.match(text, new RegExp(`^\\[${step}\\/10\\] `, 'm'), `step ${step} runs after the cached ones:\n${text}`)
    }
    assert.match(text, /^\[10\/10\] RUN echo v2/m)
    const sbx = track(await Sandbox.create(alias))
    assert.equal(await run(sbx, 'cat /home/user/app/marker.txt'), 'v2')
    assert.equal(await run(sbx, 'cat /opt/stamp/built'), stamp, 'the cached step did not run again')
    assert.equal(await run(sbx, 'cat /home/user/app/greeting.txt'), 'hello from env', 'ENV before the cache point holds')
    assert.equal(await run(sbx, `curl -sf http://127.0.0.1:${port}/index.html`), fixture('site/index.html').trim())
  })

  test('skipCache runs every step again', async () => {
    const stamp = await readStamp()
    const forced = await build(app('v2'), { skipCache: true })
    assert.doesNotMatch(forced.logs.join('\n'), /CACHED/)
    assert.notEqual(await readStamp(), stamp)
  })

  test('a failing step rejects with its output and keeps the previous template', async () => {
    const before = await readStamp()
    const broken = app('v3').runCmd('echo about-to-fail >&2; exit 3')
    const logs = []
    const err = await rejectsWith(Template.build(broken, alias, { onBuildLogs: (e) => logs.push(e.message) }),
      BuildError, 'failing build')
    assert.match(err.message, /exit code 3/)
    assert.match(err.message, /about-to-fail/)
    assert.ok(logs.some((m) => m.includes('about-to-fail')), 'the output is in the logs')
    const sbx = track(await Sandbox.create(alias))
    assert.equal(await run(sbx, 'cat /home/user/app/marker.txt'), 'v2', 'the old template stays')
    assert.equal(await readStamp(), before)
    assert.equal(await run(sbx, `curl -sf http://127.0.0.1:${port}/index.html`), fixture('site/index.html').trim())
  })

  let bgInfo
  test('buildInBackground and getBuildStatus', async () => {
    const tpl = Template().fromTemplate(alias).runCmd('echo background-build > /home/user/bg.txt')
    // A tag in the name is accepted; the template has one version.
    const info = await Template.buildInBackground(tpl, 'e2e-bg:v1')
    bgInfo = info
    assert.equal(info.templateId, 'e2e-bg')
    const seen = []
    const status = await eventually(async () => {
      const s = await Template.getBuildStatus(info, { logsOffset: seen.length })
      seen.push(...s.logEntries.map((e) => e.message))
      assert.ok(s.status === 'ready' || s.status === 'error', `status ${s.status}`)
      return s
    }, { timeoutMs: 120_000, intervalMs: 200 })
    assert.equal(status.status, 'ready', `build failed: ${JSON.stringify(status.reason)}\n${seen.join('\n')}`)
    assert.ok(seen.some((m) => m.includes('RUN echo background-build')), seen.join('\n'))
    const sbx = track(await Sandbox.create('e2e-bg:v1'))
    assert.equal(await run(sbx, 'cat /home/user/bg.txt'), 'background-build')
    assert.equal(await Template.exists('e2e-bg'), true)
    // Built on the app template: its process is still running.
    assert.equal(await run(sbx, `curl -sf http://127.0.0.1:${port}/index.html`), fixture('site/index.html').trim())
  })

  test('tags: assign, list, create from a tag, remove', async () => {
    assert.ok(bgInfo, 'the background build ran')
    const assigned = await Template.assignTags('e2e-bg:v1', ['prod', 'stable'])
    assert.deepEqual(assigned.tags, ['prod', 'stable'])
    assert.equal(assigned.buildId, bgInfo.buildId, 'the tags name the build that made the template')
    const tags = await Template.getTags('e2e-bg')
    assert.deepEqual(tags.map((t) => t.tag).sort(), ['prod', 'stable'])
    for (const t of tags) {
      assert.equal(t.buildId, bgInfo.buildId)
      assert.ok(Math.abs(Date.now() - t.createdAt.getTime()) < 10 * 60_000, `createdAt ${t.createdAt}`)
    }
    const sbx = track(await Sandbox.create('e2e-bg:prod'))
    assert.equal(await run(sbx, 'cat /home/user/bg.txt'), 'background-build')
    await Template.removeTags('e2e-bg', 'prod')
    assert.deepEqual((await Template.getTags('e2e-bg')).map((t) => t.tag), ['stable'])
    await assert.rejects(Template.assignTags('e2e-no-such-template', 'prod'), /\b404: /)
    await assert.rejects(Template.getTags('e2e-no-such-template'), /\b404: /)
    await assert.rejects(Template.assignTags('e2e-bg', 'bad tag'), /\b400: .*tag/)
  })

  test('two builds of one template run one after the other', async () => {
    const name = 'e2e-serial'
    const tpl = (m) => Template().fromBaseImage().runCmd(`echo ${m} > /home/user/m.txt && sleep 1`)
    const infos = await Promise.all(['a', 'b'].map((m) => Template.buildInBackground(tpl(m), name)))
    const spans = await Promise.all(infos.map(async (info) => {
      const entries = []
      const status = await eventually(async () => {
        const s = await Template.getBuildStatus(info, { logsOffset: entries.length })
        entries.push(...s.logEntries)
        assert.ok(s.status === 'ready' || s.status === 'error', `status ${s.status}`)
        return s
      }, { timeoutMs: 120_000, intervalMs: 200 })
      assert.equal(status.status, 'ready', JSON.stringify(status.reason))
      const times = entries.map((e) => e.timestamp.getTime())
      return [Math.min(...times), Math.max(...times)]
    }))
    const [[a0, a1], [b0, b1]] = spans
    assert.ok(a1 <= b0 || b1 <= a0, `builds overlapped: ${JSON.stringify(spans)}`)
    const sbx = track(await Sandbox.create(name))
    assert.equal(await run(sbx, 'cat /home/user/m.txt'), a1 <= b0 ? 'b' : 'a', 'the later build is the template')
  })

  test('fromDockerfile builds a template whose sandboxes have its files, env, user, workdir and CMD running', async () => {
    const name = 'e2e-dockerfile'
    const dockerfile = path.join(here, 'fixtures', 'dockerfile', 'Dockerfile')
    const logs = []
    const tpl = Template({ fileContextPath: here }).fromDockerfile(dockerfile)
    await Template.build(tpl, name, { onBuildLogs: (e) => logs.push(e.message) })
    const text = logs.join('\n')
    assert.match(text, /COPY fixtures\/dockerfile\/app.txt/, text)
    const sbx = track(await Sandbox.create(name))
    const dockerFixture = fs.readFileSync(path.join(here, 'fixtures', 'dockerfile', 'app.txt'), 'utf8')
    assert.equal(await sbx.files.read('/opt/app/app.txt'), dockerFixture)
    assert.equal(await run(sbx, 'stat -c %U /opt/app/app.txt'), 'appuser', 'COPY --chown')
    assert.equal(await run(sbx, 'cat /opt/app/built.txt'), 'built by root')
    assert.equal(await run(sbx, 'cat /opt/app/greeting.txt'), 'hello-from-arg as appuser in /opt/app')
    assert.equal(await run(sbx, 'echo "$APP_MODE"'), 'dockerfile', 'ENV reaches sandboxes')
    // The final USER and WORKDIR are the template's defaults.
    assert.equal(await run(sbx, 'id -un'), 'appuser')
    assert.equal(await run(sbx, 'pwd'), '/opt/app')
    // CMD was started by the build and snapshotted running.
    assert.equal(await run(sbx, 'curl -sf http://127.0.0.1:8081/app.txt'), dockerFixture.trim())
    assert.match(await run(sbx, 'pgrep -u appuser -f http.server || true'), /\d+/)
  })

  test('create from the built template (timing)', async () => {
    const times = []
    for (let i = 0; i < 7; i++) {
      const began = Date.now()
      const sbx = await Sandbox.create(alias)
      times.push(Date.now() - began)
      await sbx.kill()
    }
    times.sort((a, b) => a - b)
    console.log(`create from built template: p50 ${times[3]} ms, max ${times[6]} ms (7 runs)`)
  })

  test('deleting the template removes its cached steps', async () => {
    const names = async () => {
      const res = await fetch(`${process.env.E2B_API_URL}/templates`, { headers: { 'X-API-Key': process.env.E2B_API_KEY } })
      assert.equal(res.status, 200)
      return (await res.json()).map((t) => t.name ?? '')
    }
    assert.ok((await names()).some((n) => n.startsWith(`${alias}.step-`)), 'a step was cached')
    assert.equal(await Sandbox.deleteSnapshot(alias), true)
    const left = await names()
    assert.deepEqual(left.filter((n) => n.startsWith(alias)), [], `left: ${left}`)
    assert.equal(await Template.exists(alias), false)
  })

  // readStamp reads when the template's first RUN step ran.
  async function readStamp() {
    const sbx = await Sandbox.create(alias)
    try {
      return await run(sbx, 'cat /opt/stamp/built')
    } finally {
      await sbx.kill()
    }
  }
})
