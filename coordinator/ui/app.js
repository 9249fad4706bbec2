// wagma's web view: read-only, served by the coordinator itself (coordinator/ui/, compiled in).
// Live through the coordinator's event streams (docs/api.md "Event streams"): /v1/events for
// the jobs list, /v1/jobs/{id}/events for a job. Streams are read with fetch (so the bearer
// token, when the coordinator has one, goes in a header, never in a URL) and reconnect with
// backoff; every (re)connection starts with a snapshot, so a coordinator failover (another
// replica behind the same address) or a restart only shows as "reconnecting" for a moment.
'use strict';

const $ = (s) => document.querySelector(s);
const NS = 'http://www.w3.org/2000/svg';
const COLORS = ['#2457c5', '#d9480f', '#2b8a3e', '#ae3ec9', '#1098ad', '#e67700', '#c2255c',
  '#5c7cfa', '#74b816', '#f03e3e', '#0ca678', '#7048e8', '#f59f00', '#495057', '#e64980', '#3bc9db'];

let token = sessionStorage.getItem('wagma-token') || '';
let stream = null; // {abort}
let view = null;   // state of the current route

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (token) h.Authorization = 'Bearer ' + token;
  return h;
}

function setConn(state, text) {
  const c = $('#conn');
  c.dataset.state = state;
  c.textContent = text || state;
}

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const k of kids) if (k != null) e.append(k);
  return e;
}

function svg(tag, attrs, ...kids) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) if (k != null) e.append(k);
  return e;
}

const fmt = {
  num: (v, d) => (v == null || Number.isNaN(v) ? '-' : Number(v).toFixed(d)),
  pct: (v) => (v == null ? '-' : (100 * v).toFixed(2) + '%'),
  dur: (s) => (s == null ? '-' : s < 1e-3 ? (s * 1e6).toFixed(0) + 'µs'
    : s < 1 ? (s * 1e3).toFixed(1) + 'ms' : s.toFixed(2) + 's'),
  time: (t) => (t ? new Date(t * 1000).toLocaleTimeString() : '—'),
};

// ---- event streams ------------------------------------------------------------------------

// Follows path as an event stream: onEvent(name, data) for every event; reconnects with
// backoff until stopped. Returns {stop}.
function follow(path, onEvent) {
  let stopped = false, ctrl = null, delay = 500;
  async function once() {
    ctrl = new AbortController();
    const res = await fetch(path, {headers: headers({Accept: 'text/event-stream'}),
      signal: ctrl.signal, cache: 'no-store'});
    if (res.status === 401) {
      setConn('token', 'token needed');
      askToken();
      throw new Error('unauthorized');
    }
    if (res.status === 404) {
      onEvent('missing', null);
      throw new Error('not found');
    }
    if (!res.ok || !res.body) throw new Error('HTTP ' + res.status);
    setConn('live');
    delay = 500;
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let buf = '', name = '', data = [];
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.search(/\r\n|\r|\n/)) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(buf[i] === '\r' && buf[i + 1] === '\n' ? i + 2 : i + 1);
        if (line === '') {
          if (data.length) {
            let parsed = null;
            try { parsed = JSON.parse(data.join('\n')); } catch (e) { parsed = null; }
            if (parsed) onEvent(name || 'message', parsed);
          }
          name = ''; data = [];
        } else if (line.startsWith(':')) {
          // heartbeat
        } else {
          const c = line.indexOf(':');
          const field = c < 0 ? line : line.slice(0, c);
          let val = c < 0 ? '' : line.slice(c + 1);
          if (val.startsWith(' ')) val = val.slice(1);
          if (field === 'event') name = val;
          else if (field === 'data') data.push(val);
        }
      }
    }
    throw new Error('stream ended');
  }
  (async () => {
    while (!stopped) {
      try { await once(); } catch (e) { /* reconnect below */ }
      if (stopped) break;
      if ($('#conn').dataset.state !== 'token') setConn('reconnecting');
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 5000);
    }
  })();
  return {stop() { stopped = true; if (ctrl) ctrl.abort(); }};
}

function askToken() {
  const d = $('#token-dialog');
  if (!d.open) d.showModal();
}

$('#token-form').addEventListener('submit', () => {
  token = $('#token-input').value.trim();
  sessionStorage.setItem('wagma-token', token);
  route();
});

async function getJSON(path) {
  const res = await fetch(path, {headers: headers({Accept: 'application/json'}), cache: 'no-store'});
  if (!res.ok) throw new Error('HTTP ' + res.status);
  return res.json();
}

// ---- the jobs list --------------------------------------------------------------------------

// A finished job's result (status.summary, docs/api.md) in one line, as wagmactl get shows it.
function summaryText(s) {
  if (!s) return '';
  const a = s.accuracy, f4 = (x) => x.toFixed(4);
  const acc = !a ? 'no test accuracy reported'
    : s.evaluated > 1 ? `test accuracy ${f4(a.mean)} (${f4(a.min)}-${f4(a.max)} over ${s.evaluated} members)`
    : `test accuracy ${f4(a.mean)} (1 member)`;
  const loss = s.loss ? `loss ${+s.loss.mean.toPrecision(4)}` : 'no loss reported';
  return `${acc}, ${loss}, ${s.iterations} iterations in ${s.wall_time.toFixed(1)} s`;
}

// What a job trains: its built-in model, or its program's name (the arguments in the title,
// as argv: each JSON-quoted, never a shell's text).
function modelCell(spec) {
  const p = spec.program;
  if (!p) return el('td', {}, spec.model || '');
  const argv = [p.name, ...(p.args || [])].map((a) => JSON.stringify(a)).join(' ');
  return el('td', {title: 'program ' + argv, 'data-program': p.name}, p.name);
}

function jobsView() {
  const jobs = new Map();
  const render = () => {
    const tb = $('#jobs tbody');
    tb.replaceChildren();
    const list = [...jobs.values()].sort((a, b) => (b.status.created || 0) - (a.status.created || 0));
    $('#jobs-empty').hidden = list.length > 0;
    for (const j of list) {
      const total = j.spec.iterations || 0, it = j.status.iteration || 0;
      const pct = total ? Math.min(100, (100 * it) / total) : 0;
      const tr = el('tr', {'data-job': j.id},
        el('td', {}, el('a', {href: '#/job/' + encodeURIComponent(j.id)}, j.id)),
        el('td', {}, el('span', {class: 'badge s-' + j.status.state}, j.status.state)),
        el('td', {class: 'num'}, `${(j.status.members || []).length}/${j.spec.workers}`),
        el('td', {class: 'num'}, String(j.status.epoch)),
        el('td', {}, el('span', {class: 'mini'}, el('i', {style: `width:${pct}%`})),
          total ? `${it} / ${total}` : String(it)),
        el('td', {}, j.spec.algorithm), modelCell(j.spec),
        el('td', {class: 'num', title: summaryText(j.status.summary)},
          j.status.summary?.accuracy ? (100 * j.status.summary.accuracy.mean).toFixed(1) + '%' : ''),
        el('td', {}, j.status.reason || ''));
      tr.querySelector('i').style.width = pct + '%';
      tr.addEventListener('click', () => { location.hash = '#/job/' + encodeURIComponent(j.id); });
      tb.append(tr);
    }
  };
  stream = follow('/v1/events', (name, d) => {
    if (name === 'snapshot') {
      jobs.clear();
      for (const j of d.jobs || []) jobs.set(j.id, j);
    } else if (name === 'job') {
      jobs.set(d.id, d);
    } else if (name === 'deleted') {
      jobs.delete(d.job);
    } else return;
    render();
  });
  $('#jobs-view').hidden = false;
  $('#crumbs').textContent = '';
  return {};
}

// ---- one job ------------------------------------------------------------------------------

function jobView(id) {
  const st = {job: null, progress: new Map(), plan: null, timeline: [], series: {agents: [], points: []},
    groups: null, groupsKey: '', groupsBusy: false, dirty: true};
  $('#job-view').hidden = false;
  $('#crumbs').textContent = '/ ' + id;
  $('#job-title').textContent = id;

  const members = () => (st.plan ? st.plan.members.map((m) => m.name) : (st.job?.status.members || []));
  const iteration = () => {
    let it = st.job ? st.job.status.iteration || 0 : 0;
    for (const p of st.progress.values())
      if (p && p.epoch >= (st.job?.status.epoch || 0) && p.iteration > it) it = p.iteration;
    return it;
  };

  async function loadPlan() {
    try { st.plan = await getJSON(`/v1/jobs/${encodeURIComponent(id)}/plan`); } catch (e) { st.plan = null; }
    st.groupsKey = '';
    st.dirty = true;
  }

  // The groups of round t in the plan of the current epoch (GET .../groups answers from the
  // plan in effect at t; a round before the plan's start is asked as its start).
  async function loadGroups(t, key) {
    if (st.groupsBusy || !st.plan) return;
    st.groupsBusy = true;
    const plan = st.plan;
    try {
      const g = await getJSON(`/v1/jobs/${encodeURIComponent(id)}/groups?iteration=${t}`);
      if (st.plan === plan && g.epoch === plan.epoch) {
        st.groups = g;
        st.groupsKey = key;
        drawGroups();
      }
    } catch (e) { /* next tick */ }
    st.groupsBusy = false;
  }

  function renderHead() {
    const j = st.job;
    if (!j) return;
    const state = $('#job-state');
    state.textContent = j.status.state;
    state.className = 'badge s-' + j.status.state;
    const total = j.spec.iterations || 0, it = iteration();
    $('#job-bar').style.width = (total ? Math.min(100, (100 * it) / total) : 0) + '%';
    $('#job-iter').textContent = `iteration ${it}${total ? ' of ' + total : ''} · epoch ${j.status.epoch}` +
      ` · ${j.status.regroupings} regroupings`;
    $('#job-reason').textContent = j.status.reason || '';
    const res = $('#job-result');
    res.hidden = !j.status.summary;
    res.textContent = j.status.summary ? 'result: ' + summaryText(j.status.summary) : '';
    const warn = $('#job-warnings');
    warn.hidden = !(j.warnings || []).length;
    warn.replaceChildren(...(j.warnings || []).map((w) => el('li', {}, 'warning: ' + w)));
  }

  function renderMembers() {
    const tb = $('#members tbody');
    tb.replaceChildren();
    const names = members();
    const its = names.map((n) => st.progress.get(n)?.iteration ?? null);
    const max = Math.max(0, ...its.filter((x) => x != null));
    names.forEach((n, r) => {
      const p = st.progress.get(n);
      const dot = el('span', {style: `color:${COLORS[r % COLORS.length]}`}, '● ');
      tb.append(el('tr', {'data-agent': n},
        el('td', {class: 'num'}, String(r)), el('td', {}, dot, n),
        el('td', {}, p ? p.state : '-'),
        el('td', {class: 'num'}, p ? String(p.iteration) : '-'),
        el('td', {class: 'num'}, p ? String(max - p.iteration) : '-'),
        el('td', {class: 'num'}, p ? fmt.num(p.loss, 4) : '-'),
        el('td', {class: 'num'}, p ? fmt.pct(p.accuracy) : '-'),
        el('td', {class: 'num'}, p ? fmt.dur(p.step_time) : '-'),
        el('td', {class: 'num'}, p ? String(p.staleness) : '-')));
    });
  }

  function drawGroups() {
    const box = $('#groups');
    const g = st.groups, plan = st.plan;
    if (!g || !plan) { box.replaceChildren(el('p', {class: 'empty'}, 'no plan yet')); return; }
    const names = plan.members.map((m) => m.name);
    const rank = new Map(names.map((n, r) => [n, r]));
    const W = 520, pad = 10, node = 16;
    const groups = g.groups;
    const cols = Math.max(1, Math.min(groups.length, Math.ceil(Math.sqrt(groups.length * 1.6))));
    const rows = Math.ceil(groups.length / cols);
    const gw = (W - pad * (cols + 1)) / cols;
    const per = groups.map((x) => x.members.length);
    const inRow = Math.max(1, Math.floor((gw - 10) / (2 * node + 26)));
    const gh = 28 + Math.ceil(Math.max(...per) / inRow) * (2 * node + 20);
    const H = pad + rows * (gh + pad);
    const s = svg('svg', {viewBox: `0 0 ${W} ${H}`, role: 'img',
      'aria-label': `round ${g.iteration}, phase ${g.phase}, ${g.kind}`});
    groups.forEach((grp, i) => {
      const cx = pad + (i % cols) * (gw + pad), cy = pad + Math.floor(i / cols) * (gh + pad);
      const global = g.kind === 'global';
      const gEl = svg('g', {class: 'group', 'data-group': String(grp.group)});
      gEl.append(svg('rect', {x: cx, y: cy, width: gw, height: gh, rx: 8,
        fill: global ? '#f4ecfb' : '#eef3fd', stroke: global ? '#7b3fb0' : '#2457c5',
        'stroke-width': 1.5}));
      gEl.append(svg('text', {x: cx + 8, y: cy + 16, 'font-size': 11, fill: '#6b7383'},
        global ? `global round · all ${grp.members.length}` : `group ${grp.group}`));
      grp.members.forEach((m, k) => {
        const x = cx + 10 + node + (k % inRow) * (2 * node + 26);
        const y = cy + 28 + node + Math.floor(k / inRow) * (2 * node + 20);
        const r = rank.get(m) ?? 0;
        const p = st.progress.get(m);
        gEl.append(svg('circle', {cx: x, cy: y, r: node, fill: COLORS[r % COLORS.length],
          'fill-opacity': p && p.state === 'running' ? 1 : 0.45, class: 'member', 'data-agent': m}));
        gEl.append(svg('text', {x, y: y + 4, 'text-anchor': 'middle', 'font-size': 11, fill: '#fff',
          'font-weight': 600}, String(r)));
        gEl.append(svg('text', {x, y: y + node + 12, 'text-anchor': 'middle', 'font-size': 10,
          fill: '#1d2330'}, m.length > 12 ? m.slice(0, 11) + '…' : m));
      });
      s.append(gEl);
    });
    box.replaceChildren(s);
    box.dataset.phase = String(g.phase);
    box.dataset.round = String(g.iteration);
    box.dataset.kind = g.kind;
    box.dataset.epoch = String(g.epoch);
    $('#groups-caption').textContent =
      `round ${g.iteration} · phase ${g.phase + 1} of ${plan.phases.length} · ${g.kind}` +
      ` · epoch ${g.epoch}`;
    const ph = $('#phases');
    ph.replaceChildren(el('span', {}, 'phases'));
    plan.phases.forEach((_, k) => ph.append(el('span', {class: 'cell' +
      (k === g.phase && g.kind !== 'global' ? ' on' : '')}, String(k + 1))));
    const rd = $('#rounds');
    rd.replaceChildren(el('span', {}, 'rounds'));
    const tau = plan.staleness_bound;
    for (let t = g.iteration; t < g.iteration + 12; t++) {
      const glob = (t + 1) % tau === 0;
      rd.append(el('span', {class: 'cell' + (glob ? ' global' : '') + (t === g.iteration ? ' on' : ''),
        title: glob ? 'global round' : `phase ${(t % plan.phases.length) + 1}`}, String(t)));
    }
  }

  function renderTimeline() {
    const ol = $('#timeline');
    ol.replaceChildren();
    for (const e of [...st.timeline].reverse()) {
      const li = el('li', {'data-type': e.type, 'data-id': e.id},
        el('span', {class: 'when'}, fmt.time(e.time)), e.message || e.type);
      if (e.type === 'epoch') {
        li.dataset.epoch = String(e.epoch);
        const who = el('div', {class: 'who'});
        for (const x of e.left || []) who.append(el('div', {class: 'left'}, `− ${x.agent}: ${x.reason}`));
        for (const x of e.joined || []) who.append(el('div', {class: 'joined'}, `+ ${x.agent}: ${x.reason}`));
        li.append(who);
      }
      ol.append(li);
    }
  }

  function renderChart() {
    const box = $('#chart');
    const {agents, points} = st.series;
    const acc = points.filter((p) => p[1] != null);
    const usable = acc.length ? acc : points.filter((p) => p[2] != null);
    const yi = acc.length ? 1 : 2;
    if (!usable.length) { box.replaceChildren(el('p', {class: 'empty'}, 'no evaluation yet')); return; }
    const W = 520, H = 220, L = 44, B = 26, T = 10, R = 10;
    const xs = usable.map((p) => p[0]);
    const x0 = Math.min(...xs), x1 = Math.max(x0 + 1, ...xs);
    let y0 = 0, y1 = 1;
    if (yi === 2) { y0 = 0; y1 = Math.max(...usable.map((p) => p[2])) || 1; }
    const X = (v) => L + ((v - x0) / (x1 - x0)) * (W - L - R);
    const Y = (v) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
    const s = svg('svg', {viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'accuracy curve'});
    for (let k = 0; k <= 4; k++) {
      const v = y0 + ((y1 - y0) * k) / 4;
      s.append(svg('line', {x1: L, x2: W - R, y1: Y(v), y2: Y(v), stroke: '#e1e4ea'}));
      s.append(svg('text', {x: L - 6, y: Y(v) + 4, 'text-anchor': 'end', 'font-size': 10, fill: '#6b7383'},
        yi === 1 ? (100 * v).toFixed(0) + '%' : v.toFixed(2)));
    }
    s.append(svg('text', {x: L, y: H - 6, 'font-size': 10, fill: '#6b7383'}, String(x0)));
    s.append(svg('text', {x: W - R, y: H - 6, 'font-size': 10, 'text-anchor': 'end', fill: '#6b7383'},
      `${x1} iterations`));
    const names = members();
    agents.forEach((a, ai) => {
      const pts = usable.filter((p) => p[3] === ai).sort((p, q) => p[0] - q[0]);
      if (!pts.length) return;
      const r = Math.max(0, names.indexOf(a));
      s.append(svg('polyline', {fill: 'none', stroke: COLORS[r % COLORS.length], 'stroke-width': 1.6,
        points: pts.map((p) => `${X(p[0]).toFixed(1)},${Y(p[yi]).toFixed(1)}`).join(' ')}));
    });
    if (yi === 2) s.append(svg('text', {x: W - R, y: T + 10, 'text-anchor': 'end', 'font-size': 10,
      fill: '#6b7383'}, 'loss (no evaluation yet)'));
    box.replaceChildren(s);
  }

  stream = follow(`/v1/jobs/${encodeURIComponent(id)}/events`, (name, d) => {
    if (name === 'missing') { $('#job-reason').textContent = `no job ${id}`; return; }
    if (name === 'snapshot') {
      if (d.deleted) { $('#job-reason').textContent = 'deleted'; return; }
      st.job = d.job;
      st.progress.clear();
      for (const m of d.job.members || []) if (m.progress) st.progress.set(m.name, m.progress);
      st.timeline = d.timeline || [];
      st.series = d.series || {agents: [], points: []};
      loadPlan();
    } else if (name === 'job') {
      const epoch = st.job ? st.job.status.epoch : -1;
      st.job = Object.assign({}, st.job || {}, d);
      if (d.status.epoch !== epoch) loadPlan();
    } else if (name === 'plan') {
      loadPlan();
    } else if (name === 'progress') {
      st.progress.set(d.agent, d.progress);
      const p = d.progress;
      if (p.accuracy != null || p.loss != null) {
        let ai = st.series.agents.indexOf(d.agent);
        if (ai < 0) { st.series.agents.push(d.agent); ai = st.series.agents.length - 1; }
        st.series.points.push([p.iteration, p.accuracy, p.loss, ai]);
        if (st.series.points.length > 4096) st.series.points.splice(0, 2048);
      }
    } else if (name === 'timeline') {
      if (!st.timeline.some((e) => e.id === d.id)) {
        st.timeline.push(d);
        st.timeline.sort((a, b) => a.revision - b.revision);
      }
    } else if (name === 'deleted') {
      $('#job-reason').textContent = 'deleted';
    } else return;
    st.dirty = true;
  });

  // Redraw at most 4 times a second; the groups follow the job's round.
  const timer = setInterval(() => {
    if (st.plan) {
      const t = Math.max(iteration(), st.plan.start_round);
      const key = `${st.plan.epoch}:${t}`;
      if (key !== st.groupsKey) loadGroups(t, key);
    }
    if (!st.dirty) return;
    st.dirty = false;
    renderHead();
    renderMembers();
    renderTimeline();
    renderChart();
  }, 250);
  return {stop() { clearInterval(timer); }};
}

// ---- routing --------------------------------------------------------------------------------

function route() {
  if (stream) stream.stop();
  if (view && view.stop) view.stop();
  stream = null;
  $('#jobs-view').hidden = true;
  $('#job-view').hidden = true;
  setConn('connecting');
  const m = location.hash.match(/^#\/job\/(.+)$/);
  view = m ? jobView(decodeURIComponent(m[1])) : jobsView();
}

window.addEventListener('hashchange', route);
route();
