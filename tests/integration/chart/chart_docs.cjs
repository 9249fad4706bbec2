#!/usr/bin/env node
// tests/integration/chart/chart_docs.cjs ROOT — two documentation checks of test_chart:
//  1. charts/wagma/values.yaml documents every knob: each leaf key (a scalar, a list or an empty
//     map) has a "# --" comment right above it, and values.schema.json describes every key
//     (unknown keys are refused there, so a knob missing from the schema cannot exist);
//  2. the REST reference of docs/kubernetes.md (the table under "## REST reference") lists
//     exactly the operations of api/openapi.yaml, with the same query parameters, the token
//     requirement and the same status codes.
'use strict';
const fs = require('fs');
const path = require('path');
const root = path.resolve(process.argv[2] || path.join(__dirname, '../../..'));
const mods = process.env.WAGMA_TOOLS_DIR
  ? path.resolve(process.env.WAGMA_TOOLS_DIR, 'node_modules')
  : path.join(root, '.tools', 'node_modules');
const YAML = require(path.join(mods, 'yaml'));
const failures = [];
const fail = (m) => failures.push(m);

// ---- 1. values.yaml ---------------------------------------------------------------------------
const valuesText = fs.readFileSync(path.join(root, 'charts/wagma/values.yaml'), 'utf8');
const doc = YAML.parseDocument(valuesText);
const schema = JSON.parse(fs.readFileSync(path.join(root, 'charts/wagma/values.schema.json'), 'utf8'));
function resolve(s) {
  while (s && s.$ref) s = s.$ref.split('/').slice(1).reduce((o, k) => o[k], schema);
  return s;
}
// Kubernetes objects passed through as they are (documented as a whole, checked by the API's
// own schema): their keys are not knobs of the chart.
const PASSTHROUGH = new Set(['resources', 'podSecurityContext', 'containerSecurityContext', 'affinity', 'tolerations']);
function walk(map, prefix, sch) {
  map.items.forEach((pair, i) => {
    const key = String(pair.key.value);
    const name = prefix ? `${prefix}.${key}` : key;
    const sub = resolve(sch && sch.properties && sch.properties[key]);
    if (!sub) fail(`values.schema.json has no property ${name}`);
    const v = pair.value;
    const leaf = !YAML.isMap(v) || v.items.length === 0 || PASSTHROUGH.has(key) || (sub && !sub.properties);
    // the comment above a map's first key belongs to the map in the YAML tree
    const comment = (pair.key.commentBefore || '') + (i === 0 ? map.commentBefore || '' : '');
    if (leaf && !/(^|\n)\s*--\s+\S/.test(comment)) fail(`values.yaml: ${name} has no "# --" comment above it`);
    if (!leaf && YAML.isMap(v)) walk(v, name, sub);
  });
}
walk(doc.contents, '', schema);

// ---- 2. REST reference -------------------------------------------------------------------------
const api = YAML.parse(fs.readFileSync(path.join(root, 'api/openapi.yaml'), 'utf8'));
const want = new Map();
for (const [p, item] of Object.entries(api.paths)) {
  const shared = item.parameters || [];
  for (const [m, op] of Object.entries(item)) {
    if (!op || !op.responses) continue;
    const params = [...shared, ...(op.parameters || [])]
      .map((x) => (x.$ref ? x.$ref.split('/').slice(1).reduce((o, k) => o[k], api) : x))
      .filter((x) => x.in === 'query')
      .map((x) => x.name)
      .sort();
    want.set(`${m.toUpperCase()} ${p}`, {
      query: params.join(','),
      token: (op.security || api.security || []).some((s) => s && Object.keys(s).length > 0) ? 'yes' : 'no',
      codes: Object.keys(op.responses).filter((c) => /^\d{3}$/.test(c)).sort().join(','),
    });
  }
}
const md = fs.readFileSync(path.join(root, 'docs/kubernetes.md'), 'utf8');
const sec = md.split(/^## /m).find((s) => s.startsWith('REST reference'));
const got = new Map();
if (!sec) fail('docs/kubernetes.md has no "## REST reference" section');
else
  for (const line of sec.split('\n')) {
    const cells = line.split('|').map((c) => c.trim());
    if (cells.length < 8 || !/^`(GET|POST|PUT|PATCH|DELETE)`$/.test(cells[1])) continue;
    const strip = (c) => c.replace(/`/g, '').replace(/\s+/g, '');
    const key = `${strip(cells[1])} ${strip(cells[2])}`;
    if (got.has(key)) fail(`docs/kubernetes.md: ${key} listed twice`);
    got.set(key, {
      query: strip(cells[3]) === '—' || strip(cells[3]) === '' ? '' : strip(cells[3]).split(',').sort().join(','),
      token: strip(cells[4]),
      codes: [...strip(cells[5]).split(','), ...strip(cells[6]).split(',')].filter((c) => /^\d{3}$/.test(c)).sort().join(','),
    });
  }
for (const [k, w] of want) {
  const g = got.get(k);
  if (!g) {
    fail(`docs/kubernetes.md REST reference lacks ${k} (api/openapi.yaml has it)`);
    continue;
  }
  for (const f of ['query', 'token', 'codes'])
    if (g[f] !== w[f]) fail(`docs/kubernetes.md ${k}: ${f} "${g[f]}", api/openapi.yaml says "${w[f]}"`);
}
for (const k of got.keys()) if (!want.has(k)) fail(`docs/kubernetes.md lists ${k}, which api/openapi.yaml does not have`);

for (const f of failures) console.log(`FAIL docs: ${f}`);
console.log(`docs: ${want.size} operations checked against api/openapi.yaml; values.yaml keys documented: ` +
  (failures.length ? `${failures.length} failure(s)` : 'OK'));
process.exit(failures.length ? 1 : 0);
