#!/usr/bin/env node
// tests/integration/chart/smoke.cjs — runs what charts/wagma renders (ctest test_chart_smoke).
//
// `helm template` renders the chart (default values, or the files named in WAGMA_SMOKE_VALUES);
// every pod of every Deployment and StatefulSet then runs as processes on this machine, the way
// a kubelet would start it:
//  - each pod in its own network namespace with its own IP on a bridge (198.18.0.0/24, the
//    benchmarking range, in a namespace of its own: nothing of this touches the host's network),
//    and a "node" namespace from which probes and API calls come;
//  - /etc/netns/<pod>/hosts (which `ip netns exec` puts at /etc/hosts) resolves the Services'
//    names and the StatefulSet pods' stable names as cluster DNS would (a ClusterIP Service's
//    name resolves to a ready pod: there is no kube-proxy here);
//  - each container's exact command, args and env: $(VAR) expanded from its env, the downward
//    API values (metadata.name, metadata.namespace, status.podIP) and Secret keys filled in;
//    volumes (Secret, emptyDir, PVC) are directories, and paths under a mountPath in args, env
//    and workingDir are mapped to them; the image's binary is this build's (etcd: Debian's);
//  - as the pod's runAsUser/runAsGroup (setpriv), never root;
//  - the startup, readiness and liveness probes run as the kubelet would (httpGet from the node).
// Then, through the coordinator Service's DNS name and the token from the rendered Secret: the
// agents are registered under their pod names with their pod IPs, a job is submitted, trains,
// one agent pod is deleted (SIGTERM, its namespace removed), and the job goes on with the
// others to success; the checkpoint lands in the agent's mounted working directory.
//
// Needs root and `ip netns` (CI has them); otherwise exit 77 (skipped) with the cause.
// WAGMA_TEST_KEEP_LOGS=1 keeps the pods' logs. Ends with "N passed, N failed".
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const cp = require('child_process');

const here = __dirname;
const root = path.resolve(here, '../../..');
const tools = path.resolve(process.env.WAGMA_TOOLS_DIR || path.join(root, '.tools'));
const build = path.resolve(process.env.WAGMA_BUILD_DIR || path.join(root, 'build'));
const YAML = require(path.join(tools, 'node_modules', 'yaml'));
const NS = 'wagma-smoke';
const RELEASE = 'smoke';
const tag = `wgs${process.pid % 100000}`; // netns name prefix, unique per run
const SUBNET = '198.18.0';
const t0 = Date.now();
const elapsed = () => ((Date.now() - t0) / 1000).toFixed(1);
const log = (m) => console.log(`[${elapsed()} s] ${m}`);

let passed = 0;
let failed = 0;
function check(cond, what, detail) {
  if (cond) {
    passed++;
    log(`ok   ${what}`);
  } else {
    failed++;
    log(`FAIL ${what}${detail ? `: ${detail}` : ''}`);
  }
  return cond;
}
function skip(why) {
  console.log(`test_chart_smoke: SKIPPED: ${why}`);
  process.exit(77);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
function sh(cmd, args, opts = {}) {
  const r = cp.spawnSync(cmd, args, { encoding: 'utf8', ...opts });
  if (r.status !== 0 && !opts.allowFail)
    throw new Error(`${cmd} ${args.join(' ')}: ${r.status} ${r.stderr || ''}${r.error || ''}`);
  return r;
}

// ---- preconditions ------------------------------------------------------------------------------
function preconditions() {
  if (process.getuid() !== 0) skip('needs root for network namespaces (CI runs as root)');
  for (const b of ['ip', 'setpriv', 'curl', 'etcd'])
    if (sh('sh', ['-c', `command -v ${b}`], { allowFail: true }).status !== 0) skip(`${b} is not installed`);
  const probe = `${tag}-probe`;
  const r = sh('ip', ['netns', 'add', probe], { allowFail: true });
  if (r.status !== 0) skip(`network namespaces are unavailable here: ${r.stderr.trim()}`);
  sh('ip', ['netns', 'del', probe], { allowFail: true });
  for (const b of ['coordinator/wagma-coordinator', 'agent/wagma-agent'])
    if (!fs.existsSync(path.join(build, b))) {
      console.log(`test_chart_smoke: ${path.join(build, b)} is not built`);
      process.exit(1);
    }
  if (!fs.existsSync(path.join(tools, 'bin', 'helm'))) {
    console.log(`test_chart_smoke: no helm in ${tools}: run scripts/deps.sh`);
    process.exit(1);
  }
}

// ---- rendering --------------------------------------------------------------------------------
function render() {
  const args = ['template', RELEASE, path.join(root, 'charts/wagma'), '--namespace', NS];
  for (const f of (process.env.WAGMA_SMOKE_VALUES || '').split(/\s+/).filter(Boolean)) args.push('-f', path.resolve(f));
  const r = sh(path.join(tools, 'bin', 'helm'), args);
  return YAML.parseAllDocuments(r.stdout, { version: '1.1' }).map((d) => d.toJS()).filter(Boolean);
}

// ---- the cluster: namespaces, pods, DNS --------------------------------------------------------
const cluster = {
  netns: [], // created namespaces
  etcDirs: [], // /etc/netns/<name>
  procs: [], // {pod, container, child, exited, code, signal}
  tmp: fs.mkdtempSync(path.join(os.tmpdir(), 'wagma-smoke-')),
  pods: [],
  hostsEntries: [],
};
fs.chmodSync(cluster.tmp, 0o755);
const bridgeNs = `${tag}-br`;
let nextIp = 2;

function addNetns(name) {
  sh('ip', ['netns', 'add', name]);
  cluster.netns.push(name);
  sh('ip', ['-n', name, 'link', 'set', 'lo', 'up']);
  const etc = `/etc/netns/${name}`;
  fs.mkdirSync(etc, { recursive: true });
  cluster.etcDirs.push(etc);
  fs.writeFileSync(path.join(etc, 'hosts'), '127.0.0.1 localhost\n');
  // no DNS server: names resolve through the hosts file only (and fail fast otherwise)
  fs.writeFileSync(path.join(etc, 'resolv.conf'),
    `nameserver 127.0.0.1\nsearch ${NS}.svc.cluster.local svc.cluster.local cluster.local\noptions timeout:1 attempts:1\n`);
  const ip = `${SUBNET}.${nextIp++}`;
  const veth = `v${cluster.netns.length}`;
  sh('ip', ['-n', bridgeNs, 'link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', name]);
  sh('ip', ['-n', bridgeNs, 'link', 'set', veth, 'master', 'br0', 'up']);
  sh('ip', ['-n', name, 'addr', 'add', `${ip}/24`, 'dev', 'eth0']);
  sh('ip', ['-n', name, 'link', 'set', 'eth0', 'up']);
  return ip;
}
function setupBridge() {
  sh('ip', ['netns', 'add', bridgeNs]);
  cluster.netns.push(bridgeNs);
  sh('ip', ['-n', bridgeNs, 'link', 'add', 'br0', 'type', 'bridge']);
  sh('ip', ['-n', bridgeNs, 'link', 'set', 'br0', 'up']);
}

function labelsMatch(sel, labels) {
  return Object.entries(sel || {}).every(([k, v]) => (labels || {})[k] === v);
}
function writeHosts() {
  const text = ['127.0.0.1 localhost', ...cluster.hostsEntries.map(([ip, names]) => `${ip} ${names.join(' ')}`)].join('\n') + '\n';
  // in place: `ip netns exec` bind-mounts the file, a rename would not be seen
  for (const d of cluster.etcDirs) fs.writeFileSync(path.join(d, 'hosts'), text);
}
function dnsNames(name, ns) {
  return [name, `${name}.${ns}`, `${name}.${ns}.svc`, `${name}.${ns}.svc.cluster.local`];
}
// cluster DNS: pods of a StatefulSet by <pod>.<service>; a ClusterIP Service by its name, to a
// ready pod it selects (the first one: no kube-proxy); headless Services to every pod.
function refreshDns(docs) {
  const entries = [];
  for (const p of cluster.pods) {
    const names = [p.name];
    if (p.subdomain) names.push(...dnsNames(`${p.name}.${p.subdomain}`, NS));
    entries.push([p.ip, names]);
  }
  for (const s of docs.filter((d) => d.kind === 'Service')) {
    const pods = cluster.pods.filter((p) => labelsMatch(s.spec.selector, p.labels) && !p.deleted);
    const ready = s.spec.publishNotReadyAddresses ? pods : pods.filter((p) => p.ready);
    const targets = s.spec.clusterIP === 'None' ? ready : ready.slice(0, 1);
    for (const p of targets) entries.push([p.ip, dnsNames(s.metadata.name, NS)]);
  }
  cluster.hostsEntries = entries;
  writeHosts();
}

// ---- pods ----------------------------------------------------------------------------------------
function binaryFor(image, command) {
  const base = path.basename(command);
  if (base === 'wagma-coordinator') return path.join(build, 'coordinator', base);
  if (base === 'wagma-agent') return path.join(build, 'agent', base);
  if (base === 'etcd') return sh('sh', ['-c', 'command -v etcd']).stdout.trim();
  throw new Error(`no local binary for ${image} ${command}`);
}
function expand(s, env) {
  // Kubernetes: $(VAR) from the container's env, $$ escapes, unknown references stay as they are
  return String(s).replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, v) => (m === '$$' ? '$' : v in env ? env[v] : m));
}

function makePod(docs, owner, name, ordinal) {
  const t = owner.spec.template;
  const spec = t.spec;
  const ip = addNetns(`${tag}-${cluster.pods.length}`);
  const pod = {
    name,
    ns: cluster.netns[cluster.netns.length - 1],
    ip,
    owner,
    labels: t.metadata.labels,
    subdomain: owner.kind === 'StatefulSet' ? owner.spec.serviceName : null,
    ready: false,
    deleted: false,
    dir: path.join(cluster.tmp, name),
    containers: [],
  };
  fs.mkdirSync(pod.dir, { mode: 0o755 });
  const psc = spec.securityContext || {};
  const uid = psc.runAsUser;
  const gid = psc.runAsGroup || uid;
  const fsGroup = psc.fsGroup;
  // volumes: directories owned as the kubelet would make them (fsGroup)
  const volumes = {};
  const volDir = (v) => {
    const d = path.join(pod.dir, 'volumes', v);
    fs.mkdirSync(d, { recursive: true, mode: 0o775 });
    fs.chownSync(d, uid, fsGroup || gid);
    return d;
  };
  for (const v of spec.volumes || []) {
    const d = volDir(v.name);
    if (v.secret) {
      const secret = docs.find((x) => x.kind === 'Secret' && x.metadata.name === v.secret.secretName);
      if (!secret) throw new Error(`pod ${name}: Secret ${v.secret.secretName} is not rendered`);
      const items = v.secret.items || Object.keys(secret.data).map((k) => ({ key: k, path: k }));
      for (const it of items) {
        const f = path.join(d, it.path);
        fs.writeFileSync(f, Buffer.from(secret.data[it.key], 'base64'));
        fs.chownSync(f, 0, fsGroup || gid);
        fs.chmodSync(f, it.mode || v.secret.defaultMode || 0o644);
      }
    }
    volumes[v.name] = d;
  }
  for (const c of owner.spec.volumeClaimTemplates || []) volumes[c.metadata.name] = volDir(c.metadata.name);

  for (const c of spec.containers) {
    const env = {};
    for (const e of c.env || []) {
      if ('value' in e) env[e.name] = expand(e.value, env);
      else if (e.valueFrom && e.valueFrom.fieldRef) {
        const f = e.valueFrom.fieldRef.fieldPath;
        const known = { 'metadata.name': name, 'metadata.namespace': NS, 'status.podIP': ip, 'spec.nodeName': 'node-0',
          'status.hostIP': `${SUBNET}.1`, 'spec.serviceAccountName': spec.serviceAccountName };
        if (!(f in known)) throw new Error(`pod ${name}: downward API field ${f} is not emulated`);
        env[e.name] = known[f];
      } else if (e.valueFrom && e.valueFrom.secretKeyRef) {
        const r = e.valueFrom.secretKeyRef;
        const secret = docs.find((x) => x.kind === 'Secret' && x.metadata.name === r.name);
        env[e.name] = Buffer.from(secret.data[r.key], 'base64').toString();
      } else throw new Error(`pod ${name}: env ${e.name} is not emulated`);
    }
    const mounts = (c.volumeMounts || []).map((m) => {
      if (!volumes[m.name]) throw new Error(`pod ${name}: mount ${m.name} has no volume`);
      return [m.mountPath.replace(/\/$/, ''), volumes[m.name]];
    }).sort((a, b) => b[0].length - a[0].length);
    const mapPath = (s) => {
      for (const [mp, d] of mounts) {
        const i = s.indexOf(mp);
        if (i >= 0 && (s.length === i + mp.length || s[i + mp.length] === '/')) return s.slice(0, i) + d + s.slice(i + mp.length);
      }
      return s;
    };
    const command = (c.command || []).map((a) => expand(a, env));
    if (!command.length) throw new Error(`pod ${name}: container ${c.name} has no command (the image's entrypoint is not known here)`);
    const args = (c.args || []).map((a) => mapPath(expand(a, env)));
    let cwd = pod.dir;
    if (c.workingDir) {
      cwd = mapPath(c.workingDir);
      if (cwd === c.workingDir) throw new Error(`pod ${name}: workingDir ${c.workingDir} is on the read-only root filesystem`);
    }
    const csc = c.securityContext || {};
    pod.containers.push({
      name: c.name, spec: c, env: Object.fromEntries(Object.entries(env).map(([k, v]) => [k, mapPath(v)])),
      bin: binaryFor(c.image, command[0]), command, args, cwd,
      uid: csc.runAsUser || uid, gid: csc.runAsGroup || gid, groups: fsGroup,
      log: path.join(pod.dir, `${c.name}.log`), probes: {},
    });
  }
  cluster.pods.push(pod);
  return pod;
}

// a pod's environment is its container's env only; a sanitizer build's options (scripts/test.sh
// exports them) are the test harness's, passed through
const sanitizerEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) => /^(ASAN|LSAN|UBSAN|TSAN)_OPTIONS$/.test(k)));
function startPod(pod) {
  for (const c of pod.containers) {
    if (!(c.uid > 0)) throw new Error(`pod ${pod.name}: ${c.name} would run as root`);
    const out = fs.openSync(c.log, 'a');
    const argv = ['netns', 'exec', pod.ns, 'setpriv', `--reuid=${c.uid}`, `--regid=${c.gid}`,
      c.groups ? `--groups=${c.groups}` : '--clear-groups', '--', c.bin, ...c.args];
    const child = cp.spawn('ip', argv, {
      cwd: c.cwd, env: { PATH: '/usr/bin:/bin', HOSTNAME: pod.name, ...sanitizerEnv, ...c.env }, stdio: ['ignore', out, out],
    });
    fs.closeSync(out);
    const p = { pod: pod.name, container: c.name, child, exited: false, code: null, signal: null };
    child.on('exit', (code, signal) => Object.assign(p, { exited: true, code, signal }));
    cluster.procs.push(p);
    c.proc = p;
    c.started = Date.now();
  }
}

// ---- the kubelet's probes (httpGet from the node namespace) ------------------------------------
let nodeNs;
function curl(args, timeout = 5) {
  const r = sh('ip', ['netns', 'exec', nodeNs, 'curl', '-sS', '--max-time', String(timeout), ...args], { allowFail: true });
  return r;
}
function httpGet(url, headers = []) {
  const r = curl([...headers.flatMap((h) => ['-H', h]), '-w', '\n%{http_code}', url], 3);
  const lines = (r.stdout || '').split('\n');
  const code = Number(lines.pop());
  return { code, body: lines.join('\n'), err: r.stderr };
}
function probeUrl(pod, c, probe) {
  const g = probe.httpGet;
  let port = g.port;
  if (typeof port === 'string') {
    const cpn = (c.spec.ports || []).find((p) => p.name === port);
    if (!cpn) throw new Error(`pod ${pod.name}: probe port ${port} is not a container port`);
    port = cpn.containerPort;
  }
  return `http://${pod.ip}:${port}${g.path || '/'}`;
}
function probeOnce(pod, c, kind) {
  const probe = c.spec[kind];
  if (!probe) return true;
  if (!probe.httpGet) throw new Error(`pod ${pod.name}: ${kind} is not httpGet`);
  const r = httpGet(probeUrl(pod, c, probe));
  return r.code >= 200 && r.code < 400;
}
// runs the startup probe until it passes, then readiness (pod.ready) and liveness, each at its
// periodSeconds; a liveness failure streak of failureThreshold is recorded (the kubelet would
// restart the container), as is a startup probe that never passed.
const probeFailures = [];
function runProbes(pod) {
  for (const c of pod.containers) {
    c.startupDone = !c.spec.startupProbe;
    c.readyOk = !c.spec.readinessProbe;
    let liveStreak = 0;
    let startStreak = 0;
    const tick = async () => {
      while (!pod.deleted && !stopping) {
        if (!c.startupDone) {
          if (probeOnce(pod, c, 'startupProbe')) c.startupDone = true;
          else if (++startStreak >= (c.spec.startupProbe.failureThreshold || 3))
            probeFailures.push(`${pod.name}/${c.name}: startup probe failed ${startStreak} times`);
          await sleep(Math.min(1000, (c.spec.startupProbe && c.spec.startupProbe.periodSeconds || 1) * 1000));
          continue;
        }
        c.readyOk = probeOnce(pod, c, 'readinessProbe');
        if (c.spec.livenessProbe) {
          if (probeOnce(pod, c, 'livenessProbe')) liveStreak = 0;
          else if (++liveStreak >= (c.spec.livenessProbe.failureThreshold || 3))
            probeFailures.push(`${pod.name}/${c.name}: liveness probe failed ${liveStreak} times`);
        }
        pod.ready = pod.containers.every((x) => x.startupDone && x.readyOk);
        await sleep(1000); // faster than periodSeconds: the smoke test waits on it
      }
    };
    tick();
  }
}

// ---- teardown ------------------------------------------------------------------------------------
let stopping = false;
async function stopProc(p, graceMs) {
  if (p.exited) return;
  try { p.child.kill('SIGTERM'); } catch (e) { /* gone */ }
  const end = Date.now() + graceMs;
  while (!p.exited && Date.now() < end) await sleep(50);
  if (!p.exited) {
    try { p.child.kill('SIGKILL'); } catch (e) { /* gone */ }
    while (!p.exited) await sleep(20);
  }
}
async function teardown(keep) {
  stopping = true;
  await stopAll();
  for (const n of cluster.netns.reverse()) sh('ip', ['netns', 'del', n], { allowFail: true });
  for (const d of cluster.etcDirs) fs.rmSync(d, { recursive: true, force: true });
  if (keep) log(`logs kept in ${cluster.tmp}`);
  else fs.rmSync(cluster.tmp, { recursive: true, force: true });
}
// as `helm uninstall` would end: the agents, then the coordinators, then etcd; SIGKILL after 10 s
async function stopAll() {
  const comp = (p) => (cluster.pods.find((x) => x.name === p.pod) || { labels: {} }).labels['app.kubernetes.io/component'];
  for (const group of [['agent'], ['coordinator'], ['etcd'], [undefined]])
    await Promise.all(cluster.procs.filter((p) => group.includes(comp(p)) || (group[0] === undefined && !['agent', 'coordinator', 'etcd'].includes(comp(p))))
      .map((p) => stopProc(p, 10000)));
}
function tails() {
  for (const pod of cluster.pods)
    for (const c of pod.containers) {
      const text = fs.existsSync(c.log) ? fs.readFileSync(c.log, 'utf8').trim().split('\n').slice(-8).join('\n    ') : '';
      console.log(`--- ${pod.name}/${c.name} (${c.proc && c.proc.exited ? `exited ${c.proc.code ?? c.proc.signal}` : 'running'}):\n    ${text}`);
    }
}

async function waitFor(what, fn, timeoutMs) {
  const end = Date.now() + timeoutMs;
  let last;
  while (Date.now() < end) {
    last = fn();
    if (last) return last;
    await sleep(250);
  }
  return null;
}

// ---- the test ------------------------------------------------------------------------------------
async function main() {
  preconditions();
  const docs = render();
  const secret = docs.find((d) => d.kind === 'Secret');
  const token = secret ? Buffer.from(Object.values(secret.data)[0], 'base64').toString() : '';
  const workloads = docs.filter((d) => d.kind === 'StatefulSet' || d.kind === 'Deployment');
  log(`rendered ${docs.length} objects; ${workloads.map((w) => `${w.kind} ${w.metadata.name} ×${w.spec.replicas}`).join(', ')}`);

  setupBridge();
  // the node's namespace: probes and API calls come from here
  nodeNs = `${tag}-node`;
  sh('ip', ['netns', 'add', nodeNs]);
  cluster.netns.push(nodeNs);
  {
    const etc = `/etc/netns/${nodeNs}`;
    fs.mkdirSync(etc, { recursive: true });
    cluster.etcDirs.push(etc);
    sh('ip', ['-n', nodeNs, 'link', 'set', 'lo', 'up']);
    sh('ip', ['-n', bridgeNs, 'link', 'add', 'vnode', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', nodeNs]);
    sh('ip', ['-n', bridgeNs, 'link', 'set', 'vnode', 'master', 'br0', 'up']);
    sh('ip', ['-n', nodeNs, 'addr', 'add', `${SUBNET}.1/24`, 'dev', 'eth0']);
    sh('ip', ['-n', nodeNs, 'link', 'set', 'eth0', 'up']);
    fs.writeFileSync(path.join(etc, 'hosts'), '127.0.0.1 localhost\n');
  }
  nextIp = 10;
  for (const w of workloads) {
    for (let i = 0; i < w.spec.replicas; i++) {
      const name = w.kind === 'StatefulSet' ? `${w.metadata.name}-${i}` : `${w.metadata.name}-5d9c7b${i}f4-x${i}k2q`;
      makePod(docs, w, name, i);
    }
  }
  refreshDns(docs);
  // the kubelet starts every pod at once: each must wait for what it needs by itself
  for (const p of cluster.pods) startPod(p);
  for (const p of cluster.pods) runProbes(p);
  const dnsTimer = setInterval(() => refreshDns(docs), 500);
  log(`started ${cluster.pods.length} pods: ${cluster.pods.map((p) => `${p.name}=${p.ip}`).join(' ')}`);

  const byComponent = (c) => cluster.pods.filter((p) => p.labels['app.kubernetes.io/component'] === c);
  const coords = byComponent('coordinator');
  const agents = byComponent('agent');
  const etcds = byComponent('etcd');
  const svc = docs.find((d) => d.kind === 'Service' && d.metadata.labels['app.kubernetes.io/component'] === 'coordinator');
  const api = `http://${svc.metadata.name}.${NS}.svc.cluster.local:${svc.spec.ports[0].port}`;
  const auth = token ? [`Authorization: Bearer ${token}`] : [];
  const json = (r) => { try { return JSON.parse(r.body); } catch (e) { return null; } };

  try {
    const allReady = await waitFor('ready', () => [...etcds, ...coords].every((p) => p.ready) || cluster.procs.some((p) => p.exited), 60000)
      && [...etcds, ...coords].every((p) => p.ready);
    check(allReady, `etcd and coordinator pods ready (startup and readiness probes) in ${elapsed()} s`,
      [...etcds, ...coords].filter((p) => !p.ready).map((p) => p.name).join(' '));
    const early = cluster.procs.filter((p) => p.exited);
    if (!check(early.length === 0, 'no container exited at startup', early.map((p) => `${p.pod}/${p.container}: ${p.code ?? p.signal}`).join(', ')))
      throw new Error('containers exited (a flag the binary does not know? see their logs below)');

    // the coordinators: one leader, both answering through their pod IPs
    let health = [];
    await waitFor('one leader', () => {
      health = coords.map((p) => json(httpGet(`http://${p.ip}:${p.containers[0].spec.ports[0].containerPort}/healthz`)) || {});
      return health.filter((h) => h.leader === true).length === 1;
    }, 15000);
    check(health.filter((h) => h.leader === true).length === 1, 'exactly one coordinator leads', JSON.stringify(health));

    // the agents: registered under their pod names, advertising their pod IPs
    const want = agents.map((p) => `${p.name}=${p.ip}:${p.containers[0].spec.ports[0].containerPort}`).sort().join(' ');
    let got = '';
    await waitFor('agents', () => {
      const r = json(httpGet(`${api}/v1/agents`));
      got = r && r.agents ? r.agents.map((a) => `${a.name}=${a.address}`).sort().join(' ') : '';
      return got === want;
    }, 30000);
    check(got === want, 'every agent registered as its pod name at its pod IP, via the coordinator Service', `want ${want}, got ${got}`);

    // the token from the Secret guards mutations
    const submit = (spec, headers) => curl(['-X', 'POST', '-H', 'Content-Type: application/json', ...headers.flatMap((h) => ['-H', h]),
      '-d', JSON.stringify(spec), '-w', '\n%{http_code}', `${api}/v1/jobs`]);
    // long enough to outlast the pod deletion on any machine; stopped once it has gone on
    const spec = { name: 'smoke', model: 'softmax', dataset: 'synthetic', algorithm: 'wagma', workers: agents.length,
      min_workers: 2, group_size: 2, iterations: 100000000, batch_size: 32, eval_every: 1000,
      checkpoint: { every: 200, path: 'ckpt' } };
    if (token) {
      const r = submit(spec, ['Authorization: Bearer wrong-token-0123456789']);
      check(r.stdout.trim().endsWith('401'), 'a wrong token is refused (401)', r.stdout);
    }
    let r = submit(spec, auth);
    check(r.stdout.trim().endsWith('201'), 'job submitted through the Service with the Secret\'s token (201)', r.stdout + r.stderr);

    const job = (id = 'smoke') => json(httpGet(`${api}/v1/jobs/${id}`)) || {};
    const status = (j) => j.status || {};
    let j = await waitFor('running', () => {
      const x = job();
      return status(x).state === 'running' && (status(x).members || []).length === agents.length && status(x).iteration >= 200 ? x : null;
    }, 60000);
    check(j, `the job trains on ${agents.length} agents (iteration ≥ 200)`, JSON.stringify(status(job())));
    if (!j) throw new Error('the job did not start');
    const epoch0 = status(j).epoch;

    // delete one agent pod: SIGTERM, then its namespace goes
    const victim = agents[agents.length - 1];
    const vp = victim.containers[0].proc;
    const grace = (victim.owner.spec.template.spec.terminationGracePeriodSeconds || 30) * 1000;
    const tk = Date.now();
    victim.deleted = true;
    await stopProc(vp, grace);
    check(vp.code === 0 && Date.now() - tk < grace, `agent pod ${victim.name} deleted: exit 0 on SIGTERM within the grace period`,
      `exit ${vp.code ?? vp.signal} after ${Date.now() - tk} ms`);
    sh('ip', ['netns', 'del', victim.ns], { allowFail: true });
    cluster.netns.splice(cluster.netns.indexOf(victim.ns), 1);
    refreshDns(docs);

    j = await waitFor('replanned', () => {
      const x = job();
      const st = status(x);
      return st.epoch > epoch0 && (st.members || []).length === agents.length - 1 && !(st.members || []).includes(victim.name) ? x : null;
    }, 30000);
    check(j, `the job replanned without ${victim.name} (epoch ${epoch0} → ${j && status(j).epoch}, ${agents.length - 1} members)`,
      JSON.stringify(status(job())));
    const from = j ? status(j).iteration : 0;
    const epoch1 = j ? status(j).epoch : 0;
    j = await waitFor('goes on', () => {
      const x = job();
      return status(x).state === 'running' && status(x).epoch === epoch1 && status(x).iteration >= from + 300 ? x : null;
    }, 60000);
    check(j, `the job goes on with the ${agents.length - 1} others (iteration ${from} → ${j && status(j).iteration}, no further replan)`,
      JSON.stringify(status(job())));
    r = curl(['-X', 'DELETE', ...auth.flatMap((h) => ['-H', h]), '-w', '\n%{http_code}', `${api}/v1/jobs/smoke`]);
    check(r.stdout.trim().endsWith('200') && status(job()).state === 'stopped', 'the job stopped through the API', r.stdout);

    // a job on the remaining pool runs to success
    r = submit({ name: 'smoke-2', model: 'softmax', dataset: 'synthetic', workers: agents.length - 1, iterations: 300,
      batch_size: 32, eval_every: 100 }, auth);
    check(r.stdout.trim().endsWith('201'), 'a second job submitted', r.stdout + r.stderr);
    j = await waitFor('succeeded', () => {
      const x = job('smoke-2');
      return ['succeeded', 'failed', 'stopped'].includes(status(x).state) ? x : null;
    }, 120000);
    check(j && status(j).state === 'succeeded' && (status(j).members || []).length === agents.length - 1,
      `the second job succeeded on the ${agents.length - 1} remaining agents`, JSON.stringify(status(j || job('smoke-2'))));

    // rank 0 wrote its checkpoint under its mounted working directory, as a non-root user
    const ck = agents.filter((p) => !p.deleted).map((p) => path.join(p.containers[0].cwd, 'ckpt', 'smoke.ckpt')).filter((f) => fs.existsSync(f));
    check(ck.length >= 1 && fs.statSync(ck[0]).uid !== 0, 'the checkpoint is in the agent\'s mounted working directory (checkpoint root), written as non-root',
      ck.join(' ') || 'none');

    const m = httpGet(`${api}/metrics`);
    check(m.code === 200 && /wagma_jobs\{state="succeeded"\} 1/.test(m.body), '/metrics through the Service (what the ServiceMonitor scrapes)', m.body.slice(0, 200));

    check(probeFailures.length === 0, 'no startup or liveness probe failed', probeFailures.join('; '));
    const dead = cluster.procs.filter((p) => p.exited && !(p.pod === victim.name));
    check(dead.length === 0, 'no other container exited', dead.map((p) => `${p.pod}/${p.container}: ${p.code ?? p.signal}`).join(', '));
  } catch (e) {
    check(false, 'smoke test ran to the end', e.stack);
  } finally {
    clearInterval(dnsTimer);
    // deleting the release: SIGTERM to every container, which must stop cleanly in its grace period
    stopping = true;
    const t = Date.now();
    await stopAll();
    // (etcd ends by its SIGTERM after its clean shutdown; SIGKILL means the grace period ran out)
    const unclean = cluster.procs.filter((p) => !(p.code === 0 || (p.container === 'etcd' && p.signal === 'SIGTERM')));
    check(unclean.length === 0, `every container stopped cleanly on SIGTERM: wagma's with status 0 (${Date.now() - t} ms)`,
      unclean.map((p) => `${p.pod}/${p.container}: ${p.code ?? p.signal}`).join(', '));
    if (failed) tails();
    await teardown(failed > 0 || process.env.WAGMA_TEST_KEEP_LOGS === '1');
  }
  log(`test_chart_smoke: ${elapsed()} s`);
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

let cleaning = false;
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, async () => {
    if (cleaning) return;
    cleaning = true;
    console.log(`test_chart_smoke: ${sig}: stopping`);
    await teardown(true);
    process.exit(1);
  });
}
main().catch(async (e) => {
  console.log(e.stack);
  await teardown(true);
  process.exit(1);
});
