#!/usr/bin/env node
// tests/integration/chart/k8s_check.cjs — validates the objects `helm template` rendered.
//
//   node k8s_check.cjs SCENARIO FILE.yaml
//
// For every object:
//  1. the Kubernetes schema of its apiVersion/kind (kubernetes-models' compiled OpenAPI
//     validators; @kubernetes-models/prometheus-operator for the ServiceMonitor): types,
//     enums, required fields, formats;
//  2. unknown fields, which those validators let through (the API server would drop them, or
//     reject them under strict field validation): the object is validated through a Proxy that
//     records every key the validator reads. A compiled validator reads each property its schema
//     defines (present or not) and enumerates the keys of maps (labels, resources); a key of an
//     object the validator looked into that it never read is a field the schema does not have.
//     Objects the schema leaves open (never looked into) are not judged;
//  3. the chart's rules: non-root and read-only root filesystem on every pod and container, no
//     service account token, the names' lengths, Service ports that resolve to container ports;
//  4. what SCENARIO must render (GPU limits, 3 etcd members, external etcd, an existing token
//     Secret, the ServiceMonitor, programs from a volume or from the image, ...).
// Prints one line per failure and exits 1 if there is any. Modules come from .tools/ (scripts/deps.sh).
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '../../..');
const mods = process.env.WAGMA_TOOLS_DIR
  ? path.resolve(process.env.WAGMA_TOOLS_DIR, 'node_modules')
  : path.join(root, '.tools', 'node_modules');
const YAML = require(path.join(mods, 'yaml'));

const failures = [];
const fail = (msg) => failures.push(msg);

// ---- schema lookup ---------------------------------------------------------------------------
// kubernetes-models/<group>/<version>/<Kind>.js (core: v1/<Kind>.js) requires the compiled
// validator from _schemas/; it is loaded by file path (the package's exports hide _schemas).
function validatorFor(apiVersion, kind) {
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
  const candidates = [];
  if (group.endsWith('monitoring.coreos.com'))
    candidates.push(path.join(mods, '@kubernetes-models/prometheus-operator', group, version, kind + '.js'));
  else candidates.push(path.join(mods, 'kubernetes-models', group, version, kind + '.js'));
  for (const model of candidates) {
    if (!fs.existsSync(model)) continue;
    const src = fs.readFileSync(model, 'utf8');
    const m = src.match(/require\("(\.[^"]*_schemas\/[^"]+)"\)/);
    if (!m) continue;
    return require(path.resolve(path.dirname(model), m[1])).validate;
  }
  return null;
}

function tracked(obj, p, seen, touched) {
  if (obj === null || typeof obj !== 'object') return obj;
  return new Proxy(obj, {
    get(t, k) {
      if (typeof k === 'string') {
        touched.add(p);
        seen.add(p + '/' + k);
      }
      return tracked(t[k], p + '/' + String(k), seen, touched);
    },
    has(t, k) {
      touched.add(p);
      seen.add(p + '/' + String(k));
      return k in t;
    },
    ownKeys(t) {
      touched.add(p);
      for (const k of Object.keys(t)) seen.add(p + '/' + k);
      return Reflect.ownKeys(t);
    },
    getOwnPropertyDescriptor(t, k) {
      return Reflect.getOwnPropertyDescriptor(t, k);
    },
  });
}

function unknownFields(obj) {
  const out = [];
  (function walk(x, p) {
    if (x === null || typeof x !== 'object') return;
    for (const k of Object.keys(x)) {
      const q = p + '/' + k;
      if (touched.has(p) && !seen.has(q)) out.push(q);
      walk(x[k], q);
    }
  })(obj, '');
  return out;
}
let seen, touched;
let scenarioName = '';

function schemaCheck(doc, where) {
  const validate = validatorFor(doc.apiVersion, doc.kind);
  if (!validate) {
    fail(`${where}: no schema for ${doc.apiVersion} ${doc.kind}`);
    return;
  }
  seen = new Set();
  touched = new Set();
  const ok = validate(tracked(doc, '', seen, touched));
  if (!ok)
    for (const e of validate.errors)
      fail(`${where}: schema: ${e.instancePath || '/'} ${e.message || e.keyword} ${JSON.stringify(e.params)}`);
  for (const u of unknownFields(doc)) fail(`${where}: unknown field ${u}`);
}

// ---- the chart's rules ----------------------------------------------------------------------
const DNS1123 = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
function podTemplate(doc) {
  if (['Deployment', 'StatefulSet', 'DaemonSet', 'Job'].includes(doc.kind)) return doc.spec.template;
  return null;
}
function rules(doc, where, byKind) {
  const md = doc.metadata || {};
  if (!md.name || md.name.length > 63 || !DNS1123.test(md.name)) fail(`${where}: bad name ${md.name}`);
  for (const [k, v] of Object.entries(md.labels || {}))
    if (String(v).length > 63) fail(`${where}: label ${k} longer than 63`);
  const t = podTemplate(doc);
  if (!t) return;
  const spec = t.spec;
  if (doc.kind === 'StatefulSet') {
    // pod name = <name>-<ordinal>: an agent's name is its pod name, at most 63 characters
    const longest = `${md.name}-${Math.max(0, (doc.spec.replicas || 1) - 1)}`;
    if (longest.length > 63) fail(`${where}: pod name ${longest} longer than 63`);
  }
  const psc = spec.securityContext || {};
  if (psc.runAsNonRoot !== true) fail(`${where}: pod securityContext.runAsNonRoot is not true`);
  if (!(psc.runAsUser > 0)) fail(`${where}: pod securityContext.runAsUser is not a non-root uid`);
  if (spec.automountServiceAccountToken !== false) fail(`${where}: the service account token is mounted`);
  if (spec.hostNetwork || spec.hostPID || spec.hostIPC) fail(`${where}: uses the host's namespaces`);
  for (const c of [...(spec.initContainers || []), ...(spec.containers || [])]) {
    const sc = c.securityContext || {};
    if (sc.readOnlyRootFilesystem !== true) fail(`${where}: container ${c.name}: root filesystem not read-only`);
    if (sc.allowPrivilegeEscalation !== false) fail(`${where}: container ${c.name}: privilege escalation allowed`);
    if (sc.privileged) fail(`${where}: container ${c.name}: privileged`);
    if (!(sc.capabilities && (sc.capabilities.drop || []).includes('ALL')))
      fail(`${where}: container ${c.name}: capabilities not dropped`);
    if (!c.resources || !c.resources.requests) fail(`${where}: container ${c.name}: no resource requests`);
    // every $(VAR) in command/args names an env var of the container (else the kubelet leaves
    // the text as is); $$ is the kubelet's escape of a literal $
    const env = new Set((c.env || []).map((e) => e.name));
    for (const a of [...(c.command || []), ...(c.args || [])])
      for (const m of String(a).replace(/\$\$/g, '').matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g))
        if (!env.has(m[1])) fail(`${where}: container ${c.name}: $(${m[1]}) is not in its env`);
    // volume mounts name volumes of the pod (or claim templates)
    const vols = new Set([
      ...(spec.volumes || []).map((v) => v.name),
      ...((doc.spec.volumeClaimTemplates || []).map((v) => v.metadata.name)),
    ]);
    for (const m of c.volumeMounts || [])
      if (!vols.has(m.name)) fail(`${where}: container ${c.name}: mount ${m.name} has no volume`);
    for (const v of spec.volumes || [])
      if (v.secret && !byKind('Secret').some((s) => s.metadata.name === v.secret.secretName) && scenarioName !== 'existing-secret' &&
          !(scenarioName === 'etcd-client' && v.name === 'etcd-tls')) // the TLS Secret exists beforehand
        fail(`${where}: volume ${v.name}: Secret ${v.secret.secretName} is not rendered`);
  }
}

// Service selectors select a workload's pods, and target ports are container ports there.
function serviceRules(svc, where, workloads) {
  const sel = svc.spec.selector || {};
  const matches = workloads.filter((w) => {
    const labels = w.spec.template.metadata.labels || {};
    return Object.entries(sel).every(([k, v]) => labels[k] === v);
  });
  if (matches.length === 0) fail(`${where}: selects no workload's pods`);
  for (const port of svc.spec.ports || [])
    for (const w of matches) {
      const cports = w.spec.template.spec.containers.flatMap((c) => c.ports || []);
      const ok = cports.some((cp) =>
        typeof port.targetPort === 'string' ? cp.name === port.targetPort : cp.containerPort === (port.targetPort || port.port));
      if (!ok) fail(`${where}: port ${port.name}: target ${port.targetPort} is no container port of ${w.metadata.name}`);
    }
}

// ---- scenarios --------------------------------------------------------------------------------
function argsOf(w, container) {
  const c = w.spec.template.spec.containers.find((x) => x.name === container);
  return c ? c.args : [];
}
function flag(args, name) {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
}
const expect = (cond, msg) => cond || fail(`scenario: ${msg}`);

function scenario(name, docs, byKind, find) {
  const sts = byKind('StatefulSet');
  const etcd = sts.find((s) => s.metadata.labels['app.kubernetes.io/component'] === 'etcd');
  const agents = sts.filter((s) => s.metadata.labels['app.kubernetes.io/component'] === 'agent');
  const coord = byKind('Deployment').find((d) => d.metadata.labels['app.kubernetes.io/component'] === 'coordinator');
  expect(coord, 'a coordinator Deployment');
  if (!coord) return;
  const cargs = argsOf(coord, 'coordinator');
  const c = coord.spec.template.spec.containers[0];
  // common to every scenario
  expect(c.readinessProbe && c.readinessProbe.httpGet.path === '/readyz', 'coordinator readiness on /readyz');
  expect(c.livenessProbe && c.livenessProbe.httpGet.path === '/healthz', 'coordinator liveness on /healthz');
  expect(byKind('PodDisruptionBudget').some((p) => p.metadata.name === coord.metadata.name), 'a coordinator PodDisruptionBudget');
  for (const a of agents) {
    const ac = a.spec.template.spec.containers[0];
    const env = Object.fromEntries((ac.env || []).map((e) => [e.name, e.valueFrom && e.valueFrom.fieldRef && e.valueFrom.fieldRef.fieldPath]));
    expect(env.POD_NAME === 'metadata.name' && env.POD_IP === 'status.podIP', `${a.metadata.name}: POD_NAME and POD_IP from the downward API`);
    expect(flag(ac.args, '--name') === '$(POD_NAME)', `${a.metadata.name}: --name $(POD_NAME)`);
    expect(/^0\.0\.0\.0:\d+$/.test(flag(ac.args, '--listen') || ''), `${a.metadata.name}: --listen 0.0.0.0:PORT`);
    expect(flag(ac.args, '--advertise') === '$(POD_IP)', `${a.metadata.name}: --advertise $(POD_IP)`);
    const svc = find('Service', a.spec.serviceName);
    expect(svc && svc.spec.clusterIP === 'None', `${a.metadata.name}: a headless governing Service`);
    expect(flag(ac.args, '--etcd') === flag(cargs, '--etcd'), `${a.metadata.name}: the coordinators' etcd endpoints`);
    const ck = (ac.volumeMounts || []).find((m) => m.name === 'checkpoints');
    expect(ck && flag(ac.args, '--checkpoint-root') === ck.mountPath && ac.workingDir === ck.mountPath,
      `${a.metadata.name}: --checkpoint-root and workingDir are the checkpoint volume's mount`);
    // agents.programs: off unless a programs scenario turns it on
    if (!name.startsWith('programs')) {
      expect(!ac.args.some((x) => /^--program/.test(x)), `${a.metadata.name}: no --programs or --program-* flags`);
      expect(!(ac.volumeMounts || []).some((m) => m.name === 'programs') &&
        !(a.spec.template.spec.volumes || []).some((v) => v.name === 'programs'), `${a.metadata.name}: no programs volume`);
    }
  }
  const gpu = agents.find((a) => a.metadata.name.endsWith('-agent-gpu'));
  const sm = byKind('ServiceMonitor');
  const secret = byKind('Secret');
  switch (name) {
    case 'default':
      expect(etcd && etcd.spec.replicas === 1, '1 etcd member');
      expect(etcd && etcd.spec.volumeClaimTemplates && etcd.spec.volumeClaimTemplates.length === 1, 'etcd on a PVC');
      expect(coord.spec.replicas === 2, '2 coordinator replicas');
      expect(agents.length === 1 && agents[0].spec.replicas === 4, '4 CPU agents, no GPU pool');
      expect(flag(argsOf(agents[0], 'agent'), '--device') === 'cpu', '--device cpu');
      expect(flag(argsOf(agents[0], 'agent'), '--transport') === undefined, 'no --transport on CPU agents (tcp)');
      expect(secret.length === 1 && secret[0].data.token && Buffer.from(secret[0].data.token, 'base64').length === 40, 'a token Secret with a 40-character token');
      expect(flag(cargs, '--token-file') === '/etc/wagma/token/token', '--token-file from the Secret');
      expect(sm.length === 0, 'no ServiceMonitor');
      break;
    case 'gpu': {
      expect(gpu, 'a GPU agent StatefulSet');
      if (!gpu) break;
      const gc = gpu.spec.template.spec.containers[0];
      expect(gc.resources.limits['nvidia.com/gpu'] === 2, 'limits nvidia.com/gpu: 2');
      expect(flag(gc.args, '--device') === 'cuda', '--device cuda');
      expect(flag(gc.args, '--transport') === 'nccl', '--transport nccl');
      expect(/-cuda$/.test(gc.image), 'the CUDA image');
      expect(gpu.spec.template.spec.nodeSelector['nvidia.com/gpu.present'] === 'true', 'the GPU node selector');
      expect((gpu.spec.template.spec.tolerations || []).some((t) => t.key === 'nvidia.com/gpu'), 'the GPU toleration');
      expect(gpu.spec.template.spec.runtimeClassName === 'nvidia', 'runtimeClassName nvidia');
      expect(agents.length === 2, 'both pools');
      break;
    }
    case 'etcd3': {
      expect(etcd && etcd.spec.replicas === 3, '3 etcd members');
      const eargs = etcd ? argsOf(etcd, 'etcd') : [];
      const ic = eargs.find((x) => x.startsWith('--initial-cluster='));
      expect(ic && ic.split(',').length === 3, '--initial-cluster lists 3 members');
      expect(flag(cargs, '--etcd').split(',').length === 3, 'the coordinators get 3 endpoints');
      const pdb = byKind('PodDisruptionBudget').find((p) => p.metadata.name === etcd.metadata.name);
      expect(pdb && pdb.spec.minAvailable === 2, 'an etcd PodDisruptionBudget keeping 2');
      expect(etcd.spec.podManagementPolicy === 'Parallel', 'the members start together');
      break;
    }
    case 'external-etcd':
      expect(!etcd, 'no etcd StatefulSet');
      expect(!byKind('Service').some((s) => s.metadata.labels['app.kubernetes.io/component'] === 'etcd'), 'no etcd Service');
      expect(flag(cargs, '--etcd') === 'etcd-a.db.example:2379,etcd-b.db.example:2379', 'the external endpoints');
      break;
    case 'etcd-client': {
      // TLS files from the existing Secret, the password from the chart's Secret, as files only.
      const pw = secret.find((s) => s.metadata.name === 'wagma-etcd-client');
      expect(pw && Buffer.from(pw.data.password, 'base64').toString() === 's3cret-etcd-pw', 'a Secret with the etcd password');
      for (const w of [coord, ...agents]) {
        const spec = w.spec.template.spec;
        const wc = spec.containers[0];
        const mount = (n) => (wc.volumeMounts || []).find((m) => m.name === n);
        const vol = (n) => (spec.volumes || []).find((v) => v.name === n);
        expect(flag(wc.args, '--etcd-cacert') === '/etc/wagma/etcd-tls/ca.crt' &&
          flag(wc.args, '--etcd-cert') === '/etc/wagma/etcd-tls/tls.crt' &&
          flag(wc.args, '--etcd-key') === '/etc/wagma/etcd-tls/tls.key', `${w.metadata.name}: the TLS files`);
        expect(flag(wc.args, '--etcd-user') === 'wagma' &&
          flag(wc.args, '--etcd-password-file') === '/etc/wagma/etcd-password/password', `${w.metadata.name}: the user and the password file`);
        expect(!JSON.stringify(wc).includes('s3cret'), `${w.metadata.name}: no password in the container spec`);
        expect(mount('etcd-tls') && mount('etcd-tls').mountPath === '/etc/wagma/etcd-tls' && mount('etcd-tls').readOnly &&
          vol('etcd-tls') && vol('etcd-tls').secret.secretName === 'wagma-etcd-tls', `${w.metadata.name}: the TLS Secret mounted`);
        expect(mount('etcd-password') && vol('etcd-password') && vol('etcd-password').secret.secretName === 'wagma-etcd-client',
          `${w.metadata.name}: the password Secret mounted`);
      }
      break;
    }
    case 'etcd-client-inline': {
      // The chart makes the TLS Secret from the PEM values; no user, so no password Secret.
      const tls = secret.find((s) => s.metadata.name === 'wagma-etcd-tls');
      const pem = (k) => tls && tls.data[k] && Buffer.from(tls.data[k], 'base64').toString();
      expect(tls && pem('ca.crt').includes('dummyCA') && pem('tls.crt').includes('dummyCERT') && pem('tls.key').includes('dummyKEY'),
        'a Secret wagma-etcd-tls with ca.crt, tls.crt and tls.key from the values');
      expect(!secret.some((s) => s.metadata.name === 'wagma-etcd-client'), 'no password Secret without a user');
      for (const w of [coord, ...agents]) {
        const spec = w.spec.template.spec;
        const wc = spec.containers[0];
        const vol = (spec.volumes || []).find((v) => v.name === 'etcd-tls');
        expect(flag(wc.args, '--etcd-cacert') === '/etc/wagma/etcd-tls/ca.crt' && flag(wc.args, '--etcd-cert') === '/etc/wagma/etcd-tls/tls.crt',
          `${w.metadata.name}: the TLS files`);
        expect(!flag(wc.args, '--etcd-user') && !(wc.volumeMounts || []).some((m) => m.name === 'etcd-password'), `${w.metadata.name}: no etcd user`);
        expect(vol && vol.secret.secretName === 'wagma-etcd-tls', `${w.metadata.name}: the chart's TLS Secret mounted`);
      }
      break;
    }
    case 'existing-secret': {
      expect(secret.length === 0, 'no Secret rendered');
      const vol = coord.spec.template.spec.volumes.find((v) => v.name === 'token');
      expect(vol && vol.secret.secretName === 'my-wagma-token', 'the existing Secret mounted');
      expect(flag(cargs, '--token-file') === '/etc/wagma/token/api-token', 'its key as the token file');
      break;
    }
    case 'servicemonitor-on':
      expect(sm.length === 1, 'one ServiceMonitor');
      if (sm[0]) {
        expect(sm[0].spec.endpoints[0].port === 'http' && sm[0].spec.endpoints[0].path === '/metrics', 'scrapes http /metrics');
        expect(sm[0].metadata.labels.release === 'prometheus', 'the Prometheus selector label');
      }
      break;
    case 'servicemonitor-no-crd':
      expect(sm.length === 0, 'no ServiceMonitor without the CRD');
      break;
    case 'options': {
      const cspec = coord.spec.template.spec;
      expect(!flag(cargs, '--token-file') && !(cspec.volumes || []).length && secret.length === 0, 'no token: no Secret, no --token-file');
      expect(etcd && !etcd.spec.volumeClaimTemplates && etcd.spec.template.spec.volumes.some((v) => v.name === 'data' && v.emptyDir), 'etcd on an emptyDir');
      expect(argsOf(etcd, 'etcd').includes('--snapshot-count=10000'), 'etcd extraArgs');
      expect(cspec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution, 'hard anti-affinity');
      expect(cargs.includes('--max-body=131072'), 'coordinator extraArgs');
      const svc = find('Service', coord.metadata.name);
      expect(svc.spec.type === 'NodePort' && svc.spec.ports[0].nodePort === 30080, 'NodePort 30080');
      const a = agents[0];
      const aspec = a.spec.template.spec;
      expect(a.spec.updateStrategy.type === 'OnDelete', 'OnDelete agents');
      expect(aspec.volumes.some((v) => v.name === 'data' && v.persistentVolumeClaim.claimName === 'fashion-data' && v.persistentVolumeClaim.readOnly), 'the data claim, read-only');
      expect(aspec.volumes.some((v) => v.name === 'checkpoints' && v.persistentVolumeClaim.claimName === 'wagma-checkpoints'), 'the checkpoint claim');
      expect(aspec.containers[0].volumeMounts.some((m) => m.name === 'data' && m.mountPath === '/usr/share/datasets/fashion-mnist'), 'data mounted at dataDir');
      expect(aspec.imagePullSecrets[0].name === 'regcred', 'pull secrets');
      expect(docs.every((d) => d.metadata.labels.team === 'research'), 'common labels on every object');
      expect(docs.every((d) => d.metadata.name.startsWith('ml-wagma')), 'fullnameOverride');
      break;
    }
    case 'no-agents':
      expect(agents.length === 0 && !byKind('Service').some((s) => s.metadata.labels['app.kubernetes.io/component'] === 'agent'), 'no agent StatefulSet, no agent Service');
      break;
    case 'programs':
    case 'programs-in-image': {
      // --programs DIR and its flags on every pool; a volume only when one is given, read-only
      const fromVolume = name === 'programs';
      expect(agents.length === (fromVolume ? 2 : 1), fromVolume ? 'both pools' : 'the CPU pool');
      for (const a of agents) {
        const ac = a.spec.template.spec.containers[0];
        const vols = (a.spec.template.spec.volumes || []).filter((v) => v.name === 'programs');
        const mounts = (ac.volumeMounts || []).filter((m) => m.name === 'programs');
        const envs = ac.args.flatMap((x, i) => (x === '--program-env' ? [ac.args[i + 1]] : []));
        expect(flag(ac.args, '--programs') === '/opt/wagma/programs', `${a.metadata.name}: --programs /opt/wagma/programs`);
        expect(ac.args.filter((x) => x === '--programs').length === 1, `${a.metadata.name}: --programs once`);
        if (fromVolume) {
          expect(vols.length === 1 && vols[0].configMap && vols[0].configMap.name === 'my-programs' &&
            vols[0].configMap.defaultMode === 0o555, `${a.metadata.name}: the programs volume as given (configMap my-programs, 0555)`);
          expect(mounts.length === 1 && mounts[0].mountPath === '/opt/wagma/programs' && mounts[0].readOnly === true,
            `${a.metadata.name}: the programs volume mounted read-only at /opt/wagma/programs`);
          expect(JSON.stringify(envs) === JSON.stringify(['LITERAL=$$(HOME)/x', 'OMP_NUM_THREADS=2', 'PYTHONPATH=/opt/wagma/python']),
            `${a.metadata.name}: --program-env for each of agents.programs.env, sorted, $( escaped (${JSON.stringify(envs)})`);
          expect(flag(ac.args, '--program-grace') === '20' && flag(ac.args, '--program-connect-timeout') === '60',
            `${a.metadata.name}: --program-grace 20 --program-connect-timeout 60`);
        } else {
          expect(vols.length === 0 && mounts.length === 0, `${a.metadata.name}: no programs volume (the image has them)`);
          expect(envs.length === 0, `${a.metadata.name}: no --program-env`);
          expect(flag(ac.args, '--program-grace') === '10' && flag(ac.args, '--program-connect-timeout') === '30',
            `${a.metadata.name}: the default --program-grace 10 --program-connect-timeout 30`);
        }
      }
      break;
    }
    case 'smoke':
      break;
    default:
      fail(`unknown scenario ${name}`);
  }
}

// ---- main ---------------------------------------------------------------------------------------
function main() {
  const [name, file] = process.argv.slice(2);
  scenarioName = name;
  const text = fs.readFileSync(file, 'utf8');
  // YAML 1.1, as the API server's decoder reads it (octal 0440, yes/no).
  const parsed = YAML.parseAllDocuments(text, { version: '1.1', uniqueKeys: true, strict: true });
  const docs = [];
  for (const d of parsed) {
    for (const e of d.errors) fail(`YAML: ${e.message}`);
    for (const w of d.warnings) fail(`YAML warning: ${w.message}`);
    const o = d.toJS();
    if (o !== null && o !== undefined) docs.push(o);
  }
  const byKind = (k) => docs.filter((d) => d.kind === k);
  const find = (k, n) => docs.find((d) => d.kind === k && d.metadata.name === n);
  const names = new Set();
  for (const d of docs) {
    const where = `${d.kind}/${d.metadata && d.metadata.name}`;
    if (names.has(where)) fail(`${where}: rendered twice`);
    names.add(where);
    schemaCheck(d, where);
    rules(d, where, byKind);
  }
  const workloads = [...byKind('Deployment'), ...byKind('StatefulSet')];
  for (const s of byKind('Service')) serviceRules(s, `Service/${s.metadata.name}`, workloads);
  scenario(name, docs, byKind, find);
  const kinds = {};
  for (const d of docs) kinds[d.kind] = (kinds[d.kind] || 0) + 1;
  for (const f of failures) console.log(`FAIL ${name}: ${f}`);
  console.log(`${name}: ${docs.length} objects (${Object.entries(kinds).map(([k, n]) => `${n} ${k}`).join(', ')}): ` +
    (failures.length ? `${failures.length} failure(s)` : 'schemas, unknown fields, rules and scenario OK'));
  process.exit(failures.length ? 1 : 0);
}
main();
