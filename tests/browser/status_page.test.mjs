// saltgate's status page in a real browser: Debian's headless Chromium driven by playwright-core.
//
// Starts three fake masters (tcp listeners, fake_master.mjs) and the `saltgate` binary with a
// token-protected admin API, all on the test network (SALTGATE_TEST_NET, default 127.0.4), then:
// gives the page its token (a wrong one first), reads the rendered masters (a fourth whose host
// does not resolve shows `unresolved`), totals and events, opens client sessions on both listeners,
// kills one fake master and waits for its DOWN flip to show, drains another with its button and
// reads the answer, disables and enables a third with theirs, shows a `joining` master from a
// stubbed answer, saves a screenshot, checks the minion table on a stubbed /api/v1/minions, and
// stops saltgate to see the page say so. Every process it starts is stopped by PID. Run through
// scripts/browser-test.sh.
//
// Environment: SALTGATE_BIN (default target/debug/saltgate), CHROMIUM (default /usr/bin/chromium),
// ARTIFACT_DIR (default target/browser-test), SCREENSHOT (default ARTIFACT_DIR/status-page.png).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync, mkdirSync, rmSync, existsSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '../..');
const BIN = process.env.SALTGATE_BIN || path.join(ROOT, 'target/debug/saltgate');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const NET = process.env.SALTGATE_TEST_NET || '127.0.4';
const ARTIFACTS = process.env.ARTIFACT_DIR || path.join(ROOT, 'target/browser-test');
const SCREENSHOT = process.env.SCREENSHOT || path.join(ARTIFACTS, 'status-page.png');
const TOKEN = 'browser-test-' + Math.random().toString(36).slice(2);
const WAIT = 20_000; // ms: the longest any condition below may take

const children = [];       // every process started here, stopped by PID at the end
const sockets = [];
const tmp = mkdtempSync(path.join(os.tmpdir(), 'saltgate-browser-'));
let browser = null;

function stopAll() {
  for (const s of sockets) s.destroy();
  for (const c of children) {
    if (c.exitCode === null && c.signalCode === null) {
      try { process.kill(c.pid, 'SIGTERM'); } catch (_) { /* already gone */ }
    }
  }
}
process.on('exit', stopAll);

after(async () => {
  if (browser) await browser.close().catch(() => {});
  stopAll();
  rmSync(tmp, { recursive: true, force: true });
});

/** Starts `cmd` and resolves with the child once `ready(line)` is true for a line of its output. */
function start(cmd, args, ready, what) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(child);
    const log = [];
    let done = false;
    const timer = setTimeout(() => {
      if (!done) reject(new Error(`${what} did not start within ${WAIT} ms; output:\n${log.join('\n')}`));
    }, WAIT);
    const onLine = (line) => {
      log.push(line);
      if (log.length > 200) log.shift();
      let value;
      try { value = ready(line); } catch (_) { value = undefined; }
      if (!done && value) {
        done = true;
        clearTimeout(timer);
        resolve({ child, value, log });
      }
    };
    for (const stream of [child.stdout, child.stderr]) {
      let buf = '';
      stream.on('data', (d) => {
        buf += d;
        let i;
        while ((i = buf.indexOf('\n')) >= 0) { onLine(buf.slice(0, i)); buf = buf.slice(i + 1); }
      });
    }
    child.on('exit', (code, sig) => {
      if (!done) {
        done = true;
        clearTimeout(timer);
        reject(new Error(`${what} exited (${code ?? sig}) before it was ready:\n${log.join('\n')}`));
      }
    });
  });
}

const masters = [
  { name: 'alpha', ip: `${NET}.2`, weight: 1 },
  { name: 'beta', ip: `${NET}.3`, weight: 2 },
  { name: 'gamma', ip: `${NET}.4`, weight: 3 },
];
// A master whose host never resolves (RFC 6761 .invalid): saltgate starts with it `unresolved`.
const ghost = { name: 'ghost', host: 'ghost.saltgate.invalid', weight: 1 };

/** A port on `ip` that was free a moment ago (saltgate's YAML wants fixed ports, not port 0). */
function freePort(ip) {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, ip, () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

async function config() {
  const [pub, req, adm] = [await freePort(`${NET}.1`), await freePort(`${NET}.1`), await freePort(`${NET}.1`)];
  const tokenFile = path.join(tmp, 'token');
  writeFileSync(tokenFile, TOKEN + '\n', { mode: 0o600 });
  let y = 'global:\n  raise_nofile: false\n  drain_timeout: 1h\n  shutdown_grace: 1s\n' +
    'health:\n  interval: 300ms\n  fastinter: 150ms\n  downinter: 500ms\n  timeout: 500ms\n' +
    '  rise: 2\n  fall: 2\n  probe: tcp\nmasters:\n';
  for (const m of masters) {
    y += `  - name: ${m.name}\n    host: ${m.ip}\n    publish_port: ${m.ports.publish}\n` +
      `    request_port: ${m.ports.request}\n    weight: ${m.weight}\n`;
  }
  y += `  - name: ${ghost.name}\n    host: ${ghost.host}\n    weight: ${ghost.weight}\n`;
  y += `listeners:\n  publish:\n    bind: ${NET}.1:${pub}\n  request:\n    bind: ${NET}.1:${req}\n` +
    `admin:\n  bind: ${NET}.1:${adm}\n  token_file: ${tokenFile}\n`;
  const file = path.join(tmp, 'saltgate.yaml');
  writeFileSync(file, y);
  return file;
}

/** Polls `fn` until it returns a truthy value, or fails naming `what`. */
async function until(what, fn, ms = WAIT) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try { last = await fn(); } catch (e) { last = e; }
    if (last && !(last instanceof Error)) return last;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (last: ${last})`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

function connect(addr) {
  const [host, port] = [addr.slice(0, addr.lastIndexOf(':')), Number(addr.slice(addr.lastIndexOf(':') + 1))];
  return new Promise((resolve, reject) => {
    const s = net.connect({ host, port }, () => resolve(s));
    s.on('error', reject);
    sockets.push(s);
  });
}

test('the status page shows masters, flips and actions in headless Chromium', async () => {
  assert.ok(existsSync(BIN), `no saltgate binary at ${BIN} (build it, or set SALTGATE_BIN)`);
  assert.ok(existsSync(CHROMIUM), `no Chromium at ${CHROMIUM} (apt-get install chromium)`);

  for (const m of masters) {
    const r = await start('node', [path.join(HERE, 'fake_master.mjs'), m.ip],
      (l) => JSON.parse(l), `fake master ${m.name}`);
    m.proc = r.child;
    m.ports = r.value;
  }

  const addrs = {};
  const sg = await start(BIN, ['--log-format', 'json', 'run', '--config', await config()], (l) => {
    const j = JSON.parse(l);
    if (j.message === 'listening') addrs[j.listener] = j.addr;
    if (j.message === 'admin API listening') addrs.admin = j.addr;
    return addrs.admin && addrs.publish && addrs.request;
  }, 'saltgate');
  const base = `http://${addrs.admin}`;

  const profile = mkdtempSync(path.join(tmp, 'chromium-'));
  // A fresh, empty profile (playwright passes it as --user-data-dir).
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1440, height: 1000 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = browser.pages()[0] || await browser.newPage();
  const dialogs = [];
  page.on('dialog', (d) => { dialogs.push(d.message()); d.accept(); });
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  const outside = [];
  const polls = []; // times of the page's requests for the masters: one loop, every 2 s
  page.on('request', (r) => {
    if (!r.url().startsWith(base)) outside.push(r.url());
    if (r.url().endsWith('/api/v1/masters')) polls.push(Date.now());
  });

  await page.goto(base + '/');

  // The token: asked for, a wrong one refused, the right one kept in sessionStorage only.
  await page.locator('#auth').waitFor({ state: 'visible', timeout: WAIT });
  assert.match(await page.locator('#auth-message').textContent(), /needs its admin token/);
  await page.fill('#token', 'wrong');
  await page.click('#auth-form button[type=submit]');
  await until('the wrong token refused', async () =>
    /refused/.test(await page.locator('#auth-message').textContent()));
  await page.fill('#token', TOKEN);
  await page.click('#auth-form button[type=submit]');
  await page.locator('#auth').waitFor({ state: 'hidden', timeout: WAIT });
  const stored = await page.evaluate(() => ({
    session: sessionStorage.getItem('saltgate.admin.token'), local: localStorage.length,
  }));
  assert.equal(stored.session, TOKEN);
  assert.equal(stored.local, 0, 'nothing in localStorage');

  // Rendered: three masters UP with their weights, the fourth unresolved, generation 1 from the
  // start event and when it was loaded.
  const row = (name) => `#masters tr[data-master="${name}"]`;
  const rowState = (name) => page.locator(`${row(name)} .state`).textContent();
  for (const m of masters) await until(`${m.name} up`, async () => (await rowState(m.name)) === 'up');
  for (const m of [...masters, ghost]) {
    const w = await page.locator(`${row(m.name)} .weight`).textContent();
    assert.equal(w.trim(), String(m.weight));
  }
  assert.equal(await rowState('ghost'), 'unresolved');
  assert.match(await page.locator(`${row('ghost')} .state`).getAttribute('class'), /\bunresolved\b/);
  assert.equal(await page.locator('#generation').textContent(), '1');
  assert.match(await page.locator('#loaded-at').textContent(), /^\d+ s ago$/);
  assert.equal(await page.locator('#masters-up').textContent(), '3 / 4');
  assert.match(await page.locator('#events tr[data-kind="reload"]').first().textContent(),
    /generation 1 in force \(start\)/);
  // Presence is on by default: the table is there, empty (no minion has spoken yet).
  await until('the empty minion table', async () =>
    /^0 minion\(s\) connected/.test(await page.locator('#minions-status').textContent()));
  assert.equal(await page.locator('#ready').textContent(), 'ready');

  // Two client sessions through the publish listener and one through the request listener: the
  // totals and the masters count them, per port.
  await connect(addrs.publish);
  await connect(addrs.publish);
  await connect(addrs.request);
  const sessionsOn = async (port) => (await page.locator(`#masters b.sessions[data-port="${port}"]`)
    .allTextContents()).reduce((a, c) => a + (Number(c) || 0), 0);
  await until('2 publish sessions in the totals', async () =>
    (await page.locator('#sess-publish').textContent()) === '2');
  await until('1 request session in the totals', async () =>
    (await page.locator('#sess-request').textContent()) === '1');
  await until('2 + 1 sessions over the masters', async () =>
    (await sessionsOn('publish')) === 2 && (await sessionsOn('request')) === 1);
  await until('accept and refuse rates', async () =>
    /^[0-9.]+$/.test(await page.locator('#rate-accepted').textContent()) &&
    /^[0-9.]+$/.test(await page.locator('#rate-refused').textContent()));
  const bars = page.locator(`${row('alpha')} td[data-port="request"] .strip span`);
  await until('a check history strip', async () => (await bars.count()) >= 3);
  // Each bar is one check with its duration and when it ran.
  assert.match(await bars.last().getAttribute('title'), /^ok, [0-9.]+ ms, \d+ s ago$/);

  // Kill beta: the page shows it DOWN, with its flip in the events and in its row.
  const beta = masters[1];
  process.kill(beta.proc.pid, 'SIGTERM');
  await until('beta DOWN on the page', async () => (await rowState('beta')) === 'down');
  const flip = await until('beta\'s flip in the events', async () => {
    const rows = await page.locator('#events tr[data-kind="flip"]').allTextContents();
    return rows.find((t) => /beta up → down/.test(t));
  });
  assert.match(flip, /connect/, `the flip says why: ${flip}`);
  assert.match(await page.locator(`${row('beta')} .last-flip`).textContent(),
    /^up → down \d+ s ago.*connect/);
  assert.equal(await page.locator('#masters-up').textContent(), '2 / 4');

  // Drain gamma with its button: confirmed, answered, shown.
  await page.click('#masters tr[data-master="gamma"] button[data-action="drain"]');
  await until('the drain answer', async () =>
    /drain gamma: HTTP 200: now draining/.test(await page.locator('#action-result').textContent()));
  assert.equal(dialogs.length, 1, 'drain asks for confirmation');
  assert.match(dialogs[0], /drain gamma/);
  await until('gamma draining on the page', async () => (await rowState('gamma')) === 'draining');
  await until('the drain in the events', async () =>
    /drain gamma: now draining/.test(await page.locator('#events tr[data-kind="admin"]').first().textContent()));
  // After the action's extra refresh, still one loop: refreshes at least 1.5 s apart.
  const n0 = polls.length;
  await until('3 more refreshes', async () => polls.length >= n0 + 3);
  const gaps = polls.slice(n0).slice(1).map((t, i) => t - polls[n0 + i]);
  assert.ok(gaps.every((g) => g >= 1500), `refreshes ${gaps.join(', ')} ms apart`);

  // Disable alpha with its button (confirmed), then enable it (no confirmation needed).
  await page.click(`${row('alpha')} button[data-action="disable"]`);
  await until('the disable answer', async () =>
    /disable alpha: HTTP 200: now disabled/.test(await page.locator('#action-result').textContent()));
  assert.equal(dialogs.length, 2, 'disable asks for confirmation');
  assert.match(dialogs[1], /disable alpha/);
  await until('alpha disabled on the page', async () => (await rowState('alpha')) === 'disabled');
  await page.click(`${row('alpha')} button[data-action="enable"]`);
  await until('the enable answer', async () =>
    /enable alpha: HTTP 200: now up/.test(await page.locator('#action-result').textContent()));
  assert.equal(dialogs.length, 2, 'enable asks nothing');
  await until('alpha up again', async () => (await rowState('alpha')) === 'up');
  const admin = await page.locator('#events tr[data-kind="admin"]').allTextContents();
  assert.match(admin[0], /enable alpha: now up/);
  assert.match(admin[1], /disable alpha: now disabled/);

  // A discovered master not UP yet is `joining` (discovery is exercised in proxy/tests): the
  // masters answer is stubbed with one, then let through again.
  const joining = (url) => url.pathname.endsWith('/api/v1/masters');
  await page.route(joining, async (route) => {
    const real = await (await route.fetch()).json();
    for (const m of real.masters) if (m.name === 'alpha') m.state = 'joining';
    await route.fulfill({ status: 200, contentType: 'application/json', body: JSON.stringify(real) });
  });
  await until('alpha joining (stubbed)', async () => (await rowState('alpha')) === 'joining');
  assert.match(await page.locator(`${row('alpha')} .state`).getAttribute('class'), /\bjoining\b/);
  await page.unroute(joining);
  await until('alpha up (real answer)', async () => (await rowState('alpha')) === 'up');

  // The screenshot for the docs and for CI.
  mkdirSync(path.dirname(SCREENSHOT), { recursive: true });
  await page.screenshot({ path: SCREENSHOT, fullPage: true });

  // Presence: the page shows the minions /api/v1/minions lists, counts the connected ones per
  // master and searches them. The answer is stubbed in the browser (real minions are in
  // proxy/tests/presence.rs); the fourth is gone, so not counted.
  const now = Date.now();
  const minions = [
    { id: 'web01', client: '192.0.2.10:50123', publish_master: 'alpha', request_master: 'alpha', first_seen: now - 3600e3, last_seen: now - 1e3 },
    { id: 'web02', client: '192.0.2.11:50124', publish_master: 'alpha', request_master: 'gamma', first_seen: now - 60e3, last_seen: now - 2e3 },
    { id: 'db01', client: '192.0.2.12:50125', publish_master: 'gamma', request_master: 'gamma', first_seen: now - 5e3, last_seen: now },
    { id: 'old01', client: '192.0.2.13:50126', publish_master: null, publish_pairing: 'none', request_master: 'alpha', connected: false, first_seen: now - 9e3, last_seen: now - 8e3 },
  ];
  await page.route((url) => url.pathname.endsWith('/api/v1/minions'), (route) => route.fulfill({
    status: 200, contentType: 'application/json', body: JSON.stringify({ count: minions.length, total: minions.length, minions }),
  }));
  await until('the minion table', async () =>
    (await page.locator('#minion-table tbody tr').count()) === 4);
  assert.match(await page.locator('#minions-status').textContent(), /^3 minion\(s\) connected, 1 gone/);
  assert.equal((await page.locator('#masters tr[data-master="alpha"] .minion-count').textContent()), '2 / 1');
  assert.equal((await page.locator('#masters tr[data-master="gamma"] .minion-count').textContent()), '1 / 2');
  await page.fill('#minion-search', 'web');
  await until('the search', async () => (await page.locator('#minion-table tbody tr').count()) === 2);
  assert.match(await page.locator('#minions-status').textContent(), /2 match/);
  await page.fill('#minion-search', '192.0.2.12');
  await until('search by address', async () =>
    (await page.locator('#minion-table tbody tr').allTextContents()).join().includes('db01') &&
    (await page.locator('#minion-table tbody tr').count()) === 1);
  await page.screenshot({ path: path.join(path.dirname(SCREENSHOT), 'status-page-minions.png'), fullPage: true });

  assert.deepEqual(pageErrors, [], 'no script error on the page');
  assert.deepEqual(outside, [], 'the page asked for nothing outside saltgate');
  assert.equal(sg.child.exitCode, null, 'saltgate still running');

  // saltgate stops: the page says it cannot refresh, and keeps what it last showed.
  process.kill(sg.child.pid, 'SIGTERM');
  await until('the cannot-refresh banner', async () =>
    (await page.locator('#banner').isVisible()) &&
    /Cannot refresh/.test(await page.locator('#banner').textContent()));
  assert.equal(await rowState('beta'), 'down');
});
