// web_view.mjs — the browser half of test_web_view (test_web_view.c starts the cluster and the
// job, then runs this): opens the coordinator's web view in headless Chromium through
// playwright-core (executablePath: Debian's chromium; no browser is ever downloaded), waits for
// the groups to render and to change phase, kills one agent by PID, waits for the new epoch on
// the timeline (with the reason the agent left), saves a screenshot; then a job whose spec is
// known to train badly shows its warning, and the stopped job its result (status summary) on
// its page, its timeline and the jobs list. Exit 0 = every step seen;
// 1 = a step did not happen in time (stderr says which); 77 = playwright-core missing.
//   node web_view.mjs BASE_URL JOB AGENT_PID AGENT_NAME SCREENSHOT TOOLS_DIR
import { createRequire } from 'module';

const [base, job, pidArg, agentName, shot, tools] = process.argv.slice(2);
const t0 = Date.now();
const log = (m) => console.log(`[web_view ${((Date.now() - t0) / 1000).toFixed(1)}s] ${m}`);
let chromium;
try {
  chromium = createRequire(`${tools}/node_modules/`)('playwright-core').chromium;
} catch (e) {
  console.error(`playwright-core is not installed in ${tools} (scripts/deps.sh): ${e.message}`);
  process.exit(77);
}

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--no-first-run'],
});
let ok = false, page = null;
try {
  page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on('pageerror', (e) => log(`page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error') log(`console: ${m.text()}`); });
  // The jobs list first: the job is there, live.
  await page.goto(`${base}/`, { waitUntil: 'load' });
  await page.waitForSelector(`#jobs tr[data-job="${job}"]`, { timeout: 10000 });
  await page.waitForSelector('#conn[data-state="live"]', { timeout: 10000 });
  log('jobs list shows the job');
  await page.click(`#jobs tr[data-job="${job}"] a`);
  // The groups of the current round, drawn: members as nodes inside group boxes.
  await page.waitForSelector('#groups svg g.group circle.member', { timeout: 15000 });
  const first = await page.$eval('#groups', (e) => ({ phase: e.dataset.phase, round: e.dataset.round }));
  log(`groups rendered: round ${first.round}, phase ${first.phase}`);
  await page.waitForFunction((p) => {
    const e = document.querySelector('#groups');
    return e && e.dataset.phase !== '' && e.dataset.phase !== p;
  }, first.phase, { timeout: 15000, polling: 100 });
  const second = await page.$eval('#groups', (e) => ({ phase: e.dataset.phase, round: e.dataset.round }));
  log(`phase changed: round ${second.round}, phase ${second.phase}`);
  await page.waitForSelector('#members tbody tr', { timeout: 5000 });
  await page.waitForSelector('#timeline li[data-epoch="1"]', { timeout: 5000 });
  const epochs = await page.$$eval('#timeline li[data-type="epoch"]', (l) => l.map((e) => +e.dataset.epoch));
  const last = Math.max(...epochs);
  // Kill one agent: its lease expires, the coordinator publishes epoch last+1 without it.
  process.kill(Number(pidArg), 'SIGKILL');
  log(`killed ${agentName} (pid ${pidArg}); waiting for epoch ${last + 1}`);
  const sel = `#timeline li[data-epoch="${last + 1}"]`;
  await page.waitForSelector(sel, { timeout: 25000 });
  const text = await page.$eval(sel, (e) => e.textContent);
  log(`timeline: ${text}`);
  if (!text.includes(agentName) || !text.includes('registration ended'))
    throw new Error(`the new epoch does not say that ${agentName} left and why: ${text}`);
  // The groups follow the new plan (3 members), and the page keeps updating.
  await page.waitForFunction((e) => document.querySelector('#groups')?.dataset.epoch === String(e),
    last + 1, { timeout: 10000, polling: 100 });
  await page.waitForSelector('#chart svg polyline', { timeout: 10000, state: 'attached' });
  await page.waitForTimeout(600);
  await page.screenshot({ path: shot, fullPage: true });
  log(`screenshot ${shot}`);
  // A spec known to train badly says so on its page: asgd with momentum 0.9 (pending: it asks
  // for more agents than there are).
  const post = await fetch(`${base}/v1/jobs`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ name: 'warned', model: 'softmax', dataset: 'synthetic', algorithm: 'asgd', workers: 10,
      optimizer: { momentum: 0.9 } }) });
  if (post.status !== 201) throw new Error(`POST warned: ${post.status}`);
  // Stop the job: its status gets the summary of its members' last reports, which the page
  // shows as its result (and the jobs list in its result column).
  const del = await fetch(`${base}/v1/jobs/${job}`, { method: 'DELETE' });
  if (!del.ok) throw new Error(`DELETE ${job}: ${del.status}`);
  await page.waitForFunction(() => /^result: test accuracy 0\.\d{4} \(/.test(
    document.querySelector('#job-result')?.textContent || ''), null, { timeout: 10000, polling: 100 });
  log(`job page: ${await page.textContent('#job-result')}`);
  const stoppedEntry = await page.textContent('#timeline li[data-type="state"]');
  if (!stoppedEntry.includes('stopped') || !stoppedEntry.includes('test accuracy'))
    throw new Error(`the stop on the timeline has no result: ${stoppedEntry}`);
  await page.goto(`${base}/#/job/warned`, { waitUntil: 'load' });
  await page.waitForFunction(() => !document.querySelector('#job-warnings')?.hidden &&
    document.querySelector('#job-warnings li')?.textContent.includes('known to stall'), null,
  { timeout: 10000, polling: 100 });
  log(`warned job page: ${await page.textContent('#job-warnings li')}`);
  await page.goto(`${base}/`, { waitUntil: 'load' });
  await page.waitForFunction((j) => /^\d+\.\d%$/.test(
    document.querySelector(`#jobs tr[data-job="${j}"] td:nth-child(8)`)?.textContent || ''), job,
  { timeout: 10000, polling: 100 });
  log(`jobs list result: ${await page.textContent(`#jobs tr[data-job="${job}"] td:nth-child(8)`)}`);
  ok = true;
} catch (e) {
  console.error(`web_view: ${e.message}`);
  if (page) { // what the page showed, for the log
    try {
      console.error(`web_view: page text: ${(await page.textContent('main')).replace(/\s+/g, ' ')}`);
      await page.screenshot({ path: shot.replace(/\.png$/, '-failed.png'), fullPage: true });
    } catch (e2) { /* the page is gone */ }
  }
} finally {
  await browser.close();
}
process.exit(ok ? 0 : 1);
