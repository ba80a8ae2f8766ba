// The aenv web console: one page, routed by the URL's fragment, over the
// API at /console/api (the session's key is added by the server). Every
// value from the API reaches the page as text (el() never parses HTML),
// so names and metadata cannot become markup or script.
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import '@xterm/xterm/css/xterm.css';
import './app.css';

const ENVD_PORT = '49983';
const LIST_REFRESH_MS = 2000;
const METRICS_REFRESH_MS = 5000;
// LOG_ENTRIES is how many of a sandbox's newest log entries its page shows.
const LOG_ENTRIES = 200;
// SPARK_POINTS is how many readings a sandbox's sparklines in the list show.
const SPARK_POINTS = 30;
// PAGE_ROWS is how many rows a page of a list the API returns whole shows.
const PAGE_ROWS = 100;
// BUILD_LOG_POLL_MS is how often a running build's log is read.
const BUILD_LOG_POLL_MS = 1000;

// ---- DOM ----

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'class') e.className = v;
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function svgEl(tag, attrs) {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

// ---- the API ----

class APIError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function call(method, path, body, opts) {
  const headers = { 'X-Aenv-Console': '1' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const res = await fetch('/console/api' + path, {
    method, headers, credentials: 'same-origin',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (res.status === 401 && !(opts && opts.quiet)) {
    state.me = null;
    render();
    throw new APIError(401, 'logged out');
  }
  const text = await res.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = text; }
  }
  if (!res.ok) {
    const msg = data && data.message ? data.message : `${res.status} ${res.statusText}`;
    throw new APIError(res.status, msg);
  }
  return { data, headers: res.headers };
}

const get = async (path) => (await call('GET', path)).data;

// ---- envd, as the E2B SDK speaks to it (Connect over HTTP, JSON) ----

function envdHeaders(sb, contentType) {
  const h = {
    'Content-Type': contentType,
    'Connect-Protocol-Version': '1',
    'E2b-Sandbox-Id': sb.sandboxID,
    'E2b-Sandbox-Port': ENVD_PORT,
  };
  if (sb.envdAccessToken) h['X-Access-Token'] = sb.envdAccessToken;
  return h;
}

async function envdUnary(sb, method, msg) {
  const res = await fetch('/' + method, {
    method: 'POST', headers: envdHeaders(sb, 'application/json'), body: JSON.stringify(msg),
  });
  const text = await res.text();
  const data = text ? JSON.parse(text) : {};
  if (!res.ok) throw new APIError(res.status, data.message || `${res.status}`);
  return data;
}

// envdStream calls a server-streaming method and gives each message to
// onMessage until the stream ends (or signal aborts it).
async function envdStream(sb, method, msg, onMessage, signal) {
  const json = new TextEncoder().encode(JSON.stringify(msg));
  const body = new Uint8Array(5 + json.length);
  new DataView(body.buffer).setUint32(1, json.length);
  body.set(json, 5);
  const res = await fetch('/' + method, {
    method: 'POST', headers: envdHeaders(sb, 'application/connect+json'), body, signal,
  });
  if (!res.ok) {
    const text = await res.text();
    let m = text;
    try { m = JSON.parse(text).message || text; } catch { /* plain text */ }
    throw new APIError(res.status, m);
  }
  const reader = res.body.getReader();
  let buf = new Uint8Array(0);
  const dec = new TextDecoder();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    const joined = new Uint8Array(buf.length + value.length);
    joined.set(buf);
    joined.set(value, buf.length);
    buf = joined;
    while (buf.length >= 5) {
      const flags = buf[0];
      const len = new DataView(buf.buffer, buf.byteOffset).getUint32(1);
      if (buf.length < 5 + len) break;
      const payload = JSON.parse(dec.decode(buf.subarray(5, 5 + len)) || '{}');
      buf = buf.slice(5 + len);
      if (flags & 2) {
        if (payload.error) throw new APIError(0, payload.error.message || payload.error.code);
        return;
      }
      onMessage(payload);
    }
  }
}

function toBase64(bytes) {
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

function fromBase64(b64) {
  const s = atob(b64);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

// ---- formatting ----

function ago(iso) {
  if (!iso) return '';
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 60) return `${Math.floor(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d`;
}

function bytes(n) {
  if (n === undefined || n === null) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : '';
}

function metadataText(md) {
  return Object.entries(md || {}).map(([k, v]) => `${k}=${v}`).join(' ');
}

// ---- state and routing ----

const state = {
  me: undefined, // undefined: not asked yet; null: logged out
  timers: [],
  cleanups: [],
  gen: 0, // counts the pages shown
  flash: null,
};

function onLeave(fn) { state.cleanups.push(fn); }

// every runs fn every ms while the page that asked stays shown. A page
// passes state.gen as it was when the page began: a page that finishes
// loading after the user has moved on starts nothing.
function every(ms, fn, gen) {
  if (gen !== state.gen) return;
  const t = setInterval(fn, ms);
  state.timers.push(t);
}

function leave() {
  state.gen++;
  state.timers.forEach(clearInterval);
  state.timers = [];
  const c = state.cleanups;
  state.cleanups = [];
  c.forEach((fn) => { try { fn(); } catch { /* gone already */ } });
}

// flash shows a message above the page (an error unless kind says
// otherwise); null takes it away.
function flash(msg, kind) {
  state.flash = msg ? { msg, kind: kind || 'error' } : null;
  const f = document.getElementById('flash');
  if (f) f.replaceChildren(flashNode());
}

function flashNode() {
  if (!state.flash) return '';
  return el('div', { class: `flash ${state.flash.kind}`, 'data-test': 'flash' }, state.flash.msg,
    el('button', { class: 'link', onclick: () => flash(null) }, '×'));
}

// act runs an action of a button, says what went wrong, and refreshes.
// The last message goes first, so that what the action says itself
// (a fork's count, a snapshot's ID) stays.
async function act(what, fn, after) {
  flash(null);
  try {
    await fn();
    if (after) after();
  } catch (e) {
    if (!(e instanceof APIError && e.status === 401)) flash(`${what}: ${e.message}`);
  }
}

const routes = [
  [/^sandboxes$/, pageSandboxes, 'Sandboxes'],
  [/^sandboxes\/([a-z0-9-]+)$/, pageSandbox, null],
  [/^templates$/, pageTemplates, 'Templates'],
  [/^snapshots$/, pageSnapshots, 'Snapshots'],
  [/^volumes$/, pageVolumes, 'Volumes'],
  [/^nodes$/, pageNodes, 'Nodes', true],
  [/^usage$/, pageUsage, 'Usage'],
  [/^teams$/, pageTeams, 'Teams', true],
  [/^keys$/, pageKeys, 'Keys'],
  [/^audit$/, pageAudit, 'Audit log', true],
];

async function render() {
  leave();
  const root = document.getElementById('app');
  if (state.me === undefined) {
    try {
      state.me = (await call('GET', '/api-keys/current', undefined, { quiet: true })).data;
    } catch {
      state.me = null;
    }
  }
  if (!state.me) {
    root.replaceChildren(loginPage());
    return;
  }
  const hash = location.hash.replace(/^#\/?/, '') || 'sandboxes';
  let page = null;
  let args = [];
  for (const [re, fn] of routes) {
    const m = hash.match(re);
    if (m) { page = fn; args = m.slice(1); break; }
  }
  const main = el('main', {});
  root.replaceChildren(header(hash), el('div', { id: 'flash' }, flashNode()), main);
  if (!page) {
    main.append(el('p', {}, 'No such page.'));
    return;
  }
  try {
    await page(main, ...args);
  } catch (e) {
    if (!(e instanceof APIError && e.status === 401)) main.append(el('p', { class: 'error' }, e.message));
  }
}

function header(hash) {
  const nav = routes.filter(([, , label, admin]) => label && (!admin || state.me.admin)).map(([re, , label]) => {
    const target = re.source.replace(/^\^|\$$/g, '');
    return el('a', { href: `#/${target}`, class: hash.split('/')[0] === target ? 'active' : '' }, label);
  });
  return el('header', {},
    el('span', { class: 'brand' }, 'aenv'),
    el('nav', {}, nav),
    el('span', { class: 'who', 'data-test': 'who' },
      `${state.me.keyName || 'key'} · team ${state.me.teamID}${state.me.admin ? ' · admin' : ''}`),
    el('button', { class: 'link', 'data-test': 'logout', onclick: logout }, 'Log out'));
}

function loginPage() {
  const key = el('input', { type: 'password', name: 'key', autocomplete: 'current-password', placeholder: 'API key', 'data-test': 'key', required: true });
  const msg = el('p', { class: 'error', 'data-test': 'login-error' });
  const form = el('form', {
    class: 'login',
    onsubmit: async (ev) => {
      ev.preventDefault();
      msg.textContent = '';
      const res = await fetch('/console/login', {
        method: 'POST', credentials: 'same-origin',
        headers: { 'Content-Type': 'application/json', 'X-Aenv-Console': '1' },
        body: JSON.stringify({ key: key.value }),
      });
      if (!res.ok) {
        let m = `${res.status}`;
        try { m = (await res.json()).message || m; } catch { /* not JSON */ }
        msg.textContent = `Not logged in: ${m}`;
        return;
      }
      state.me = await res.json();
      render();
    },
  }, el('h1', {}, 'aenv console'), el('label', {}, 'API key', key),
  el('button', { type: 'submit', 'data-test': 'login' }, 'Log in'), msg);
  return form;
}

async function logout() {
  await fetch('/console/logout', { method: 'POST', credentials: 'same-origin', headers: { 'X-Aenv-Console': '1' } });
  state.me = null;
  location.hash = '';
  render();
}

// ---- tables ----

// table renders rows with columns [label, row => text or node]; rows may
// carry a data-test key.
function table(columns, rows, key) {
  return el('table', {},
    el('thead', {}, el('tr', {}, columns.map(([label]) => el('th', {}, label)))),
    el('tbody', {}, rows.length === 0
      ? el('tr', {}, el('td', { colspan: columns.length, class: 'empty' }, 'None.'))
      : rows.map((r) => el('tr', { 'data-test': key ? key(r) : null }, columns.map(([, f]) => el('td', {}, f(r)))))));
}

function button(label, onclick, attrs) {
  return el('button', Object.assign({ onclick }, attrs || {}), label);
}

// confirmButton asks for a second click before doing anything that
// cannot be undone.
function confirmButton(label, onconfirm, attrs) {
  const b = button(label, () => {
    if (b.dataset.armed) {
      delete b.dataset.armed;
      onconfirm();
      return;
    }
    b.dataset.armed = '1';
    b.textContent = `Confirm ${label.toLowerCase()}`;
    setTimeout(() => { delete b.dataset.armed; b.textContent = label; }, 4000);
  }, Object.assign({ class: 'danger' }, attrs || {}));
  return b;
}

// ---- sandboxes ----

async function pageSandboxes(main) {
  const gen = state.gen;
  const body = el('div', {});
  const pager = el('div', { class: 'pager' });
  let token = '';
  const tokens = [];
  // Each listed sandbox's newest readings, oldest first: its sparklines.
  const readings = new Map();
  main.append(el('h2', {}, 'Sandboxes'), body, pager);
  const load = async (refreshing) => {
    const q = new URLSearchParams({ limit: '100' });
    if (token) q.set('nextToken', token);
    const { data, headers } = await call('GET', `/v2/sandboxes?${q}`);
    // The first drawing does not wait for the readings (the page loads as
    // fast as its list); the refreshes draw them.
    const sampled = sampleMetrics(data || [], readings).catch(() => {});
    if (refreshing) await sampled;
    // A refresh that comes back while the user arms a kill or types waits
    // for the next one.
    if (refreshing && busy(body)) return;
    const next = headers.get('x-next-token');
    body.replaceChildren(table([
      ['ID', (s) => el('a', { href: `#/sandboxes/${s.sandboxID}`, 'data-test': 'sandbox-link' }, s.sandboxID)],
      ['Template', (s) => s.alias || s.templateID],
      ['State', (s) => el('span', { class: `state ${s.state}`, 'data-test': 'state' }, s.state + (s.unresponsive ? ' (unresponsive)' : ''))],
      ['Node', (s) => s.nodeID || s.clientID || ''],
      ['Age', (s) => ago(s.startedAt)],
      ['vCPU', (s) => s.cpuCount],
      ['CPU', (s) => cpuCell(readings.get(s.sandboxID))],
      ['Memory', (s) => memoryCell(s, readings.get(s.sandboxID))],
      ['Metadata', (s) => el('span', { class: 'metadata', 'data-test': 'metadata' }, metadataText(s.metadata))],
      ['', (s) => sandboxActions(s, load)],
    ], data || [], (s) => `sandbox-${s.sandboxID}`));
    pager.replaceChildren(
      tokens.length ? button('← Newer', () => { token = tokens.pop(); load(); }) : '',
      next ? button('Older →', () => { tokens.push(token); token = next; load(); }) : '');
  };
  await load();
  every(LIST_REFRESH_MS, () => { if (!busy(body)) load(true).catch(() => {}); }, gen);
}

// sampleMetrics adds the running sandboxes' newest readings (one call for
// the page: E2B's batch metrics) to readings, keeping SPARK_POINTS each.
async function sampleMetrics(sandboxes, readings) {
  const ids = sandboxes.filter((s) => s.state === 'running').map((s) => s.sandboxID);
  // Only the page's running sandboxes keep their readings.
  for (const id of [...readings.keys()]) if (!ids.includes(id)) readings.delete(id);
  if (ids.length === 0) return;
  const data = await get(`/sandboxes/metrics?sandbox_ids=${ids.map(encodeURIComponent).join(',')}`);
  for (const [id, m] of Object.entries((data && data.sandboxes) || {})) {
    const points = readings.get(id) || [];
    // Samples are taken every few seconds; the list is read more often.
    if (points.length === 0 || points[points.length - 1].timestampUnix !== m.timestampUnix) points.push(m);
    readings.set(id, points.slice(-SPARK_POINTS));
  }
}

// cpuCell is a sandbox's CPU use: a sparkline of its readings and the newest.
function cpuCell(points) {
  if (!points || points.length === 0) return '';
  const last = points[points.length - 1];
  return el('span', { class: 'spark', 'data-test': 'cpu' }, sparkline(points.map((p) => p.cpuUsedPct), 100),
    ` ${last.cpuUsedPct.toFixed(0)} %`);
}

function memoryCell(s, points) {
  if (!points || points.length === 0) return `${s.memoryMB} MiB`;
  const last = points[points.length - 1];
  return el('span', { class: 'spark', 'data-test': 'memory' }, sparkline(points.map((p) => p.memUsed), last.memTotal || 1),
    ` ${bytes(last.memUsed)} of ${s.memoryMB} MiB`);
}

// sparkline draws values (0 to max) as a small line; nothing below two.
function sparkline(values, max) {
  if (values.length < 2) return '';
  const w = 60;
  const h = 16;
  const svg = svgEl('svg', { viewBox: `0 0 ${w} ${h}`, class: 'sparkline' });
  const pts = values.map((v, i) => `${(i / (values.length - 1)) * w},${h - (Math.min(v, max) / max) * (h - 2) - 1}`);
  svg.append(svgEl('polyline', { points: pts.join(' ') }));
  return svg;
}

// busy reports whether the user is in the middle of something in box (a
// confirmation armed, a field being edited) that a refresh would undo.
function busy(box) {
  return box.querySelector('[data-armed]') !== null || box.contains(document.activeElement);
}

function sandboxActions(s, after) {
  const id = s.sandboxID;
  return el('span', { class: 'actions' },
    s.state === 'running' ? button('Pause', () => act('pause', () => call('POST', `/sandboxes/${id}/pause`), after)) : '',
    s.state === 'paused' ? button('Resume', () => act('resume', () => call('POST', `/sandboxes/${id}/connect`, { timeout: 300 }), after)) : '',
    confirmButton('Kill', () => act('kill', () => call('DELETE', `/sandboxes/${id}`), after), { 'data-test': 'kill' }));
}

async function pageSandbox(main, id) {
  const gen = state.gen;
  let sb = await get(`/sandboxes/${id}`);
  const info = el('div', {});
  const stateActions = el('span', {});
  const actions = el('div', { class: 'actions' });
  const chart = el('div', { class: 'chart' });
  const egressLog = el('div', { 'data-test': 'egress-log' });
  const sandboxLog = el('div', { 'data-test': 'sandbox-log' });
  const logLevel = el('select', { 'aria-label': 'lowest level', 'data-test': 'log-level' },
    ['debug', 'info', 'warn', 'error'].map((l) => el('option', { value: l, selected: l === 'info' }, l)));
  const showInfo = () => {
    info.replaceChildren(el('dl', {}, [
      ['State', el('span', { 'data-test': 'state' }, sb.state)], ['Template', sb.alias || sb.templateID],
      ['Node', sb.nodeID || sb.clientID || ''], ['Started', when(sb.startedAt)], ['Ends', when(sb.endAt)],
      ['vCPU', sb.cpuCount], ['Memory', `${sb.memoryMB} MiB`], ['Disk', sb.diskSizeMB ? `${sb.diskSizeMB} MiB` : ''],
      ['Metadata', el('span', { 'data-test': 'metadata' }, metadataText(sb.metadata))],
      ['Volumes', (sb.volumeMounts || []).map((v) => `${v.name}:${v.path}`).join(' ')],
      ['Egress', el('span', { 'data-test': 'egress-policy' }, egressPolicyText(sb))],
    ].flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, v)])));
    if (!busy(stateActions)) stateActions.replaceChildren(sandboxActions(sb, refresh));
  };
  const refresh = async () => {
    try {
      sb = await get(`/sandboxes/${id}`);
    } catch (e) {
      if (e.status === 404) { sb = Object.assign({}, sb, { state: 'gone' }); showInfo(); return; }
      throw e;
    }
    showInfo();
  };
  actions.append(...forkSnapshotTimeout(sb, refresh), stateActions);
  showInfo();
  main.append(el('h2', {}, 'Sandbox ', el('code', {}, id)), info, actions,
    el('h3', {}, 'Metrics'), chart,
    el('h3', {}, 'Terminal'), terminalPanel(() => sb),
    el('h3', {}, 'Files'), filesPanel(() => sb),
    el('h3', {}, 'Log ', logLevel), sandboxLog,
    el('h3', {}, 'Egress by name'), egressLog);
  const metrics = async () => {
    if (sb.state !== 'running') return;
    const m = await get(`/sandboxes/${id}/metrics`);
    chart.replaceChildren(metricsChart(m || []));
    egressLog.replaceChildren(egressTable(await get(`/sandboxes/${id}/egress`)));
  };
  let logAsked = 0; // the newest log request: an older answer is not drawn
  const log = async () => {
    if (sb.state === 'gone') return;
    const asked = ++logAsked;
    const q = new URLSearchParams({ direction: 'backward', limit: String(LOG_ENTRIES), level: logLevel.value });
    const data = await get(`/v2/sandboxes/${id}/logs?${q}`);
    if (asked === logAsked) sandboxLog.replaceChildren(logTable(data.logs));
  };
  logLevel.onchange = () => { log().catch(() => {}); };
  metrics().catch(() => {});
  log().catch(() => {});
  every(METRICS_REFRESH_MS, () => { refresh().catch(() => {}); metrics().catch(() => {}); log().catch(() => {}); }, gen);
}

// logTable shows the sandbox's own log (what its envd logged), newest last.
function logTable(entries) {
  if (!entries || entries.length === 0) {
    return el('p', { class: 'muted' }, 'Nothing logged at this level since the sandbox last started or resumed on its node.');
  }
  return table([
    ['Time', (e) => new Date(e.timestamp).toLocaleTimeString()],
    ['Level', (e) => el('span', { class: `level-${e.level}` }, e.level)],
    ['Message', (e) => e.message],
    ['Fields', (e) => el('span', { class: 'fields' }, Object.keys(e.fields || {}).sort().map((k) => `${k}=${e.fields[k]}`).join(' '))],
  ], entries, (e) => `log-${e.level}`);
}

// egressPolicyText is a sandbox's egress policy in a line.
function egressPolicyText(sb) {
  const n = sb.network || {};
  const parts = [];
  if (sb.allowInternetAccess === false) parts.push('internet off');
  if ((n.allowOut || []).length) parts.push(`allow ${n.allowOut.join(', ')}`);
  if ((n.denyOut || []).length) parts.push(`deny ${n.denyOut.join(', ')}`);
  if (n.egressProxy) parts.push(`via ${n.egressProxy.address}`);
  return parts.length ? parts.join('; ') : 'open';
}

// egressTable shows the egress gateway's newest events, newest first.
function egressTable(events) {
  const rows = (events || []).slice(-50).reverse();
  if (rows.length === 0) {
    return el('p', { class: 'muted' }, 'Nothing judged by name: only a sandbox whose policy allows host names goes through the egress gateway.');
  }
  return table([
    ['Time', (e) => new Date(e.time).toLocaleTimeString()],
    ['Verdict', (e) => el('span', { class: `verdict-${e.verdict}` }, e.verdict)],
    ['Protocol', (e) => e.protocol],
    ['Host', (e) => e.host || ''],
    ['Port', (e) => e.port || ''],
    ['Rule', (e) => e.rule || ''],
    ['Out', (e) => bytes(e.bytesOut)],
    ['In', (e) => bytes(e.bytesIn)],
    ['Reason', (e) => e.reason || ''],
  ], rows, (e) => `egress-${e.verdict}`);
}

function forkSnapshotTimeout(sb, after) {
  const id = sb.sandboxID;
  const count = el('input', { type: 'number', min: 1, max: 64, value: 1, class: 'small', 'aria-label': 'children' });
  const timeout = el('input', { type: 'number', min: 1, value: 300, class: 'small', 'aria-label': 'timeout (s)' });
  return [
    el('span', {}, button('Fork', () => act('fork', async () => {
      const { data } = await call('POST', `/sandboxes/${id}/fork`, { count: Number(count.value) });
      const made = (data || []).filter((r) => r.sandbox).length;
      flash(`Forked ${made} of ${count.value}.`, 'info');
    }, after)), ' ×', count),
    button('Snapshot', () => act('snapshot', async () => {
      const { data } = await call('POST', `/sandboxes/${id}/snapshots`, {});
      flash(`Snapshot ${data.snapshotID} taken.`, 'info');
    }, after)),
    el('span', {}, button('Set timeout', () => act('set timeout',
      () => call('POST', `/sandboxes/${id}/timeout`, { timeout: Number(timeout.value) }), after)), ' ', timeout, ' s'),
  ];
}

// metricsChart draws CPU % and memory use over time as two lines.
function metricsChart(points) {
  if (points.length < 2) return el('p', { class: 'muted' }, 'Collecting…');
  const w = 600;
  const h = 120;
  const svg = svgEl('svg', { viewBox: `0 0 ${w} ${h}`, class: 'metrics', 'data-test': 'metrics' });
  const t0 = points[0].timestampUnix;
  const span = Math.max(1, points[points.length - 1].timestampUnix - t0);
  const line = (f, max, cls) => {
    const pts = points.map((p) => `${((p.timestampUnix - t0) / span) * w},${h - (f(p) / Math.max(max, 1e-9)) * (h - 4) - 2}`);
    svg.append(svgEl('polyline', { points: pts.join(' '), class: cls }));
  };
  line((p) => p.cpuUsedPct, 100, 'cpu');
  line((p) => p.memUsed, Math.max(...points.map((p) => p.memTotal || p.memUsed)), 'mem');
  const last = points[points.length - 1];
  return el('div', {}, svg,
    el('p', { class: 'legend' }, el('span', { class: 'cpu' }, `CPU ${last.cpuUsedPct.toFixed(1)} %`), ' ',
      el('span', { class: 'mem' }, `memory ${bytes(last.memUsed)} of ${bytes(last.memTotal)}`)));
}

// terminalPanel opens a PTY in the sandbox, as the E2B SDK's
// sandbox.pty.create does, and shows it in an xterm.
function terminalPanel(sandbox) {
  const box = el('div', { class: 'terminal', 'data-test': 'terminal' });
  const status = el('span', { class: 'muted', 'data-test': 'terminal-status' });
  let stop = null;
  const open = async () => {
    if (stop) return;
    const sb = sandbox();
    const term = new Terminal({ convertEol: false, cursorBlink: true, fontSize: 13, scrollback: 5000 });
    const fit = new FitAddon();
    term.loadAddon(fit);
    box.replaceChildren();
    term.open(box);
    fit.fit();
    term.focus();
    const abort = new AbortController();
    let pid = 0;
    const enc = new TextEncoder();
    // Keys go one call at a time, in order: calls in parallel could take
    // different connections and reach the shell shuffled. What is typed
    // while one is in flight goes in the next.
    let queued = '';
    let sending = false;
    const flush = () => {
      if (sending || !queued || !pid) return;
      const chunk = queued;
      queued = '';
      sending = true;
      envdUnary(sb, 'process.Process/SendInput', { process: { pid }, input: { pty: toBase64(enc.encode(chunk)) } })
        .catch((e) => { status.textContent = `input: ${e.message}`; })
        .finally(() => { sending = false; flush(); });
    };
    const send = (s) => { queued += s; flush(); };
    const onData = term.onData(send);
    const onResize = term.onResize(({ cols, rows }) => {
      if (pid) envdUnary(sb, 'process.Process/Update', { process: { pid }, pty: { size: { cols, rows } } }).catch(() => {});
    });
    const resize = () => fit.fit();
    window.addEventListener('resize', resize);
    stop = () => {
      // The shell would outlive its stream: envd keeps a process whose
      // caller went away.
      if (pid) envdUnary(sb, 'process.Process/SendSignal', { process: { pid }, signal: 'SIGNAL_SIGKILL' }).catch(() => {});
      abort.abort();
      onData.dispose();
      onResize.dispose();
      window.removeEventListener('resize', resize);
      term.dispose();
      stop = null;
    };
    onLeave(() => stop && stop());
    status.textContent = 'connecting…';
    envdStream(sb, 'process.Process/Start', {
      process: { cmd: '/bin/bash', args: ['-i', '-l'], envs: { TERM: 'xterm-256color', LANG: 'C.UTF-8' } },
      pty: { size: { cols: term.cols, rows: term.rows } },
    }, (m) => {
      const ev = m.event || {};
      if (ev.start) {
        pid = ev.start.pid;
        status.textContent = `connected (pid ${pid})`;
        term.focus();
        flush();
      } else if (ev.data && ev.data.pty) {
        term.write(fromBase64(ev.data.pty));
      } else if (ev.end) {
        pid = 0;
        status.textContent = `exited (${ev.end.exitCode || 0})`;
      }
    }, abort.signal).catch((e) => {
      if (!abort.signal.aborted) status.textContent = `closed: ${e.message}`;
    }).finally(() => {
      if (!abort.signal.aborted && !status.textContent.startsWith('closed')) status.textContent = 'closed';
    });
  };
  return el('div', {},
    el('div', { class: 'actions' },
      button('Open terminal', open, { 'data-test': 'open-terminal' }),
      button('Close', () => { if (stop) { stop(); status.textContent = 'closed'; } }), status),
    box);
}

// filesPanel lists a directory of the sandbox (envd's ListDir) and
// downloads files (envd's /files).
function filesPanel(sandbox) {
  const list = el('div', {});
  const pathInput = el('input', { type: 'text', value: '/home/user', class: 'path', 'data-test': 'files-path' });
  const show = async (dir) => {
    pathInput.value = dir;
    try {
      const res = await envdUnary(sandbox(), 'filesystem.Filesystem/ListDir', { path: dir, depth: 1 });
      const entries = (res.entries || []).sort((a, b) => a.name.localeCompare(b.name));
      const parent = dir.replace(/\/[^/]+\/?$/, '') || '/';
      list.replaceChildren(table([
        ['Name', (e) => e.type === 'FILE_TYPE_DIRECTORY'
          ? el('a', { href: '#', onclick: (ev) => { ev.preventDefault(); show(e.path); } }, `${e.name}/`)
          : el('a', { href: '#', onclick: (ev) => { ev.preventDefault(); download(e.path, e.name); } }, e.name)],
        ['Size', (e) => (e.type === 'FILE_TYPE_DIRECTORY' ? '' : bytes(Number(e.size || 0)))],
        ['Mode', (e) => e.permissions || ''],
        ['Modified', (e) => when(e.modifiedTime)],
      ], dir === '/' ? entries : [{ name: '..', type: 'FILE_TYPE_DIRECTORY', path: parent }, ...entries]));
    } catch (e) {
      list.replaceChildren(el('p', { class: 'error' }, e.message));
    }
  };
  const download = async (p, name) => {
    const sb = sandbox();
    const res = await fetch(`/files?${new URLSearchParams({ path: p })}`, { headers: envdHeaders(sb, 'application/octet-stream') });
    if (!res.ok) { flash(`download: ${res.status}`); return; }
    saveBlob(await res.blob(), name);
  };
  return el('div', {},
    el('form', { class: 'actions', onsubmit: (ev) => { ev.preventDefault(); show(pathInput.value); } },
      pathInput, el('button', { type: 'submit', 'data-test': 'files-list' }, 'List')),
    list);
}

function saveBlob(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = el('a', { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// ---- the other objects ----

async function pageTemplates(main) {
  const gen = state.gen;
  const rows = (await get('/templates')) || [];
  const log = el('div', { 'data-test': 'build-log' });
  main.append(el('h2', {}, 'Templates'), pagedTable([
    ['ID', (t) => el('code', {}, t.templateID)],
    ['Names', (t) => (t.aliases || []).join(', ') || t.name || ''],
    ['Kind', (t) => t.kind || ''],
    // A gateway lists templates from the cluster's records, which carry no
    // build status; the node running a template's builds has their logs.
    ['Build', (t) => (t.name ? el('span', {}, t.buildStatus ? `${t.buildStatus} ` : '',
      button('Log', () => { showBuildLog(log, t.name, gen).catch((e) => flash(e.message)); },
        { 'data-test': 'build-log-open' })) : '')],
    ['vCPU', (t) => t.cpuCount],
    ['Memory', (t) => (t.memoryMB ? `${t.memoryMB} MiB` : '')],
    ['Created', (t) => when(t.createdAt)],
  ], rows, (t) => `template-${t.name || t.templateID}`), log);
}

// showBuildLog shows the newest build of template name and its log, and
// follows it while it runs (E2B's build status, a page of entries at a
// time from the last offset).
async function showBuildLog(box, name, gen) {
  let builds;
  try {
    builds = await get(`/templates/${encodeURIComponent(name)}/builds`);
  } catch (e) {
    // A gateway knows no node for a template never built in the cluster.
    if (e.status !== 404) throw e;
  }
  if (!builds || builds.length === 0) {
    box.replaceChildren(el('p', { class: 'muted' }, `No build of ${name} is remembered by its node.`));
    return;
  }
  const b = builds[0];
  const status = el('span', { 'data-test': 'build-status' }, b.status);
  const lines = el('pre', { class: 'build-log', 'data-test': 'build-log-lines' });
  box.replaceChildren(el('h3', {}, `Build ${b.buildID} of ${name}: `, status), lines);
  let offset = 0;
  for (;;) {
    const q = new URLSearchParams({ logsOffset: String(offset), limit: '100' });
    const info = await get(`/templates/${encodeURIComponent(name)}/builds/${b.buildID}/status?${q}`);
    for (const e of info.logEntries || []) {
      lines.append(`${new Date(e.timestamp).toLocaleTimeString()} ${e.level.padEnd(5)} ${e.step ? `[${e.step}] ` : ''}${e.message}\n`);
    }
    offset += (info.logEntries || []).length;
    status.textContent = info.status + (info.reason ? `: ${info.reason.message}` : '');
    if ((info.logEntries || []).length === 100) continue; // more pages now
    if (info.status !== 'waiting' && info.status !== 'building') return;
    // The page was left, or another log replaced this one.
    if (state.gen !== gen || !lines.isConnected) return;
    await new Promise((resolve) => setTimeout(resolve, BUILD_LOG_POLL_MS));
  }
}

// pagedTable is table() shown PAGE_ROWS rows at a time, for lists the
// API returns whole.
function pagedTable(columns, rows, key) {
  const box = el('div', {});
  const pager = el('div', { class: 'pager' });
  const show = (page) => {
    const pages = Math.max(1, Math.ceil(rows.length / PAGE_ROWS));
    box.replaceChildren(table(columns, rows.slice(page * PAGE_ROWS, (page + 1) * PAGE_ROWS), key));
    pager.replaceChildren(
      page > 0 ? button('← Previous', () => show(page - 1)) : '',
      pages > 1 ? el('span', { 'data-test': 'page' }, ` page ${page + 1} of ${pages} `) : '',
      page + 1 < pages ? button('Next →', () => show(page + 1), { 'data-test': 'next-page' }) : '');
  };
  show(0);
  return el('div', {}, box, pager);
}

async function pageSnapshots(main) {
  let rows = [];
  const more = el('div', { class: 'pager' });
  const load = async (token) => {
    const q = new URLSearchParams({ limit: '100' });
    if (token) q.set('nextToken', token);
    const { data, headers } = await call('GET', `/snapshots?${q}`);
    rows = token ? rows.concat(data || []) : (data || []);
    const next = headers.get('x-next-token');
    more.replaceChildren(next ? button('More', () => load(next)) : '');
    body.replaceChildren(table([
      ['ID', (s) => el('code', {}, s.snapshotID)],
      ['Names', (s) => (s.names || []).join(', ')],
      ['From sandbox', (s) => s.sandboxID || ''],
      ['Created', (s) => when(s.createdAt)],
      ['Upload', (s) => (s.upload || '') + (s.uploadError ? `: ${s.uploadError}` : '')],
      ['', (s) => button('Start', () => act('start', async () => {
        const { data } = await call('POST', `/snapshots/${s.snapshotID}/fork`, { count: 1 });
        const made = (data || []).find((r) => r.sandbox);
        if (made) location.hash = `#/sandboxes/${made.sandbox.sandboxID}`;
      }))],
    ], rows));
  };
  const body = el('div', {});
  main.append(el('h2', {}, 'Snapshots'), body, more);
  await load();
}

async function pageVolumes(main) {
  const body = el('div', {});
  const name = el('input', { type: 'text', placeholder: 'name', class: 'small' });
  const load = async () => {
    const rows = await get('/volumes');
    body.replaceChildren(pagedTable([
      ['ID', (v) => el('code', {}, v.volumeID)],
      ['Name', (v) => v.name],
      ['', (v) => confirmButton('Delete', () => act('delete', () => call('DELETE', `/volumes/${v.volumeID}`), load))],
    ], rows || []));
  };
  main.append(el('h2', {}, 'Volumes'),
    el('form', { class: 'actions', onsubmit: (ev) => { ev.preventDefault(); act('create', () => call('POST', '/volumes', { name: name.value }), load); } },
      name, el('button', { type: 'submit' }, 'Create volume')), body);
  await load();
}

async function pageNodes(main) {
  const gen = state.gen;
  let cluster = true;
  let rows;
  try {
    rows = await get('/cluster/nodes');
  } catch (e) {
    if (e.status !== 404) throw e;
    cluster = false;
    rows = [await get('/node')];
  }
  const body = el('div', {});
  const show = () => body.replaceChildren(table([
    ['ID', (n) => el('code', {}, n.id)],
    ['Address', (n) => n.address || ''],
    ['State', (n) => el('span', { class: `state ${n.state}` }, n.state + (n.stateReason ? ` (${n.stateReason})` : ''))],
    ['Version', (n) => n.version || ''],
    ['Sandboxes', (n) => `${n.use ? n.use.sandboxes : ''}${n.capacity && n.capacity.maxSandboxes ? ` / ${n.capacity.maxSandboxes}` : ''}`],
    ['Memory', (n) => `${n.use ? n.use.memoryMB : ''}${n.capacity ? ` / ${n.capacity.memoryMB}` : ''} MiB`],
    ['vCPUs', (n) => (n.capacity ? n.capacity.vcpus : '')],
    ['Heartbeat', (n) => (n.heartbeatAgeMs !== undefined ? `${(n.heartbeatAgeMs / 1000).toFixed(1)} s ago` : '')],
    ['', (n) => (cluster && state.me.admin ? el('span', { class: 'actions' },
      n.state === 'draining' ? button('Undrain', () => act('undrain', () => call('POST', `/cluster/nodes/${n.id}/undrain`), reload))
        : button('Drain', () => act('drain', () => call('POST', `/cluster/nodes/${n.id}/drain`), reload))) : '')],
  ], rows || []));
  const reload = async () => { rows = cluster ? await get('/cluster/nodes') : [await get('/node')]; show(); };
  show();
  main.append(el('h2', {}, cluster ? 'Cluster nodes' : 'This node'), body);
  every(LIST_REFRESH_MS * 2, () => reload().catch(() => {}), gen);
}

async function pageUsage(main) {
  const rows = await get('/usage');
  main.append(el('h2', {}, 'Usage by team and day'),
    el('p', {}, button('Download CSV', () => act('CSV', async () => {
      // Fetched, not followed as a link: the console's API takes calls
      // with its header only.
      const res = await fetch('/console/api/usage?format=csv', { headers: { 'X-Aenv-Console': '1' } });
      if (!res.ok) throw new APIError(res.status, `${res.status}`);
      saveBlob(await res.blob(), 'aenv-usage.csv');
    }), { 'data-test': 'usage-csv' })),
    table([
      ['Day', (u) => u.day], ['Team', (u) => u.teamID],
      ['Sandbox-hours', (u) => (u.sandboxSeconds / 3600).toFixed(2)],
      ['Memory GiB-hours', (u) => (u.memoryMBSeconds / 1024 / 3600).toFixed(2)],
      ['vCPU-hours', (u) => (u.vcpuSeconds / 3600).toFixed(2)],
      ['CPU-hours used', (u) => (u.cpuSeconds !== undefined ? (u.cpuSeconds / 3600).toFixed(2) : '')],
      ['Stored GiB-hours', (u) => (u.storedMBSeconds !== undefined ? (u.storedMBSeconds / 1024 / 3600).toFixed(2) : '')],
    ], rows || []));
}

const limitFields = [['maxSandboxes', 'sandboxes'], ['maxMemoryMB', 'memory MiB'], ['maxVCPUs', 'vCPUs'],
  ['maxStarting', 'starting'], ['createsPerSecond', 'creates/s'], ['maxSnapshots', 'snapshots'],
  ['maxSnapshotMB', 'snapshot MiB'],
  ['maxVolumes', 'volumes'], ['maxVolumeMB', 'volume MiB']];

async function pageTeams(main) {
  const body = el('div', {});
  const load = async () => {
    const rows = await get('/teams');
    body.replaceChildren(table([
      ['Team', (t) => el('code', {}, t.teamID)],
      ...limitFields.map(([f, label]) => [label, (t) => limitInput(t, f)]),
      ['Created', (t) => when(t.createdAt)],
      ['', (t) => confirmButton('Delete', () => act('delete', () => call('DELETE', `/teams/${t.teamID}`), load))],
    ], rows || []));
  };
  const name = el('input', { type: 'text', placeholder: 'team name', class: 'small' });
  main.append(el('h2', {}, 'Teams'), el('p', { class: 'muted' }, 'Limits: empty or 0 is none; a change is saved when the field is left.'),
    el('form', { class: 'actions', onsubmit: (ev) => { ev.preventDefault(); act('create', () => call('POST', '/teams', { teamID: name.value }), load); } },
      name, el('button', { type: 'submit' }, 'Create team')), body);
  await load();
}

function limitInput(team, field) {
  const input = el('input', { type: 'number', min: 0, class: 'small', value: team[field] || '' });
  input.addEventListener('change', () => act('set limit',
    () => call('PATCH', `/teams/${team.teamID}`, { [field]: Number(input.value || 0) })));
  return input;
}

async function pageKeys(main) {
  const body = el('div', {});
  const shown = el('div', {});
  const load = async () => {
    const rows = await get('/api-keys');
    body.replaceChildren(table([
      ['Name', (k) => k.name], ['Prefix', (k) => el('code', {}, k.prefix)], ['Team', (k) => k.teamID],
      ['Admin', (k) => (k.admin ? 'yes' : '')], ['Created', (k) => when(k.createdAt)],
      ['Last used', (k) => when(k.lastUsed)], ['Expires', (k) => when(k.expiresAt)],
      ['Revoked', (k) => when(k.revokedAt)],
      ['', (k) => (k.revokedAt ? '' : confirmButton('Revoke', () => act('revoke', () => call('DELETE', `/api-keys/${k.id}`), load)))],
    ], rows || []));
  };
  const name = el('input', { type: 'text', placeholder: 'key name', class: 'small' });
  const team = el('input', { type: 'text', placeholder: 'team (yours if empty)', class: 'small' });
  const days = el('input', { type: 'number', min: 0, placeholder: 'expires in days', class: 'small' });
  main.append(el('h2', {}, 'API keys'),
    el('form', {
      class: 'actions',
      onsubmit: (ev) => {
        ev.preventDefault();
        act('create key', async () => {
          const { data } = await call('POST', '/api-keys',
            { name: name.value, teamID: team.value, expiresIn: Number(days.value || 0) * 86400 });
          shown.replaceChildren(el('p', { class: 'flash info' }, 'The new key, shown this once: ', el('code', { 'data-test': 'new-key' }, data.key)));
        }, load);
      },
    }, name, state.me.admin ? team : '', days, el('button', { type: 'submit' }, 'Create key')), shown, body);
  await load();
}

async function pageAudit(main) {
  const body = el('div', {});
  const more = el('div', { class: 'pager' });
  const team = el('input', { type: 'text', placeholder: 'team', class: 'small' });
  const object = el('input', { type: 'text', placeholder: 'object ID', class: 'small' });
  let rows = [];
  const load = async (before) => {
    const q = new URLSearchParams({ limit: '100' });
    if (team.value) q.set('team', team.value);
    if (object.value) q.set('object', object.value);
    if (before) q.set('before', String(before));
    const page = (await get(`/audit?${q}`)) || [];
    rows = before ? rows.concat(page) : page;
    body.replaceChildren(table([
      ['When', (e) => when(e.at)], ['Team', (e) => e.teamID], ['Key', (e) => e.keyName || e.keyID || ''],
      ['Action', (e) => e.action], ['Object', (e) => e.object || ''], ['Result', (e) => e.status],
      ['From', (e) => e.remote || ''],
    ], rows));
    more.replaceChildren(page.length === 100 ? button('More', () => load(page[page.length - 1].seq)) : '');
  };
  main.append(el('h2', {}, 'Audit log'),
    el('form', { class: 'actions', onsubmit: (ev) => { ev.preventDefault(); load(); } },
      team, object, el('button', { type: 'submit' }, 'Filter')), body, more);
  await load();
}

window.addEventListener('hashchange', render);
render();
