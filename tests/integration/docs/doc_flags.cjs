#!/usr/bin/env node
// tests/integration/docs/doc_flags.cjs ROOT — ctest test_docs_flags: the command-line flags of
// every installed wagma binary against what users read, both ways.
//
// The binaries: every file docker/Dockerfile* copies from the build into /usr/local/bin
// (wagma-coordinator, wagma-agent, wagma-train, wagmactl today). A binary whose option table this
// test cannot find fails it: teach it the new table (SOURCES: where a binary's main is, when not
// in the directory of its build output).
//
// The truth is the option table the binary's main parses (getopt_long's `struct option` array in
// coordinator/main.c and agent/main.c, wagmactl's `opts[]` in api/wagmactl/args.c). Checked:
//  1. --help: the binary's `--help` output (run from WAGMA_BUILD_DIR) names every option, and
//     every `--flag` it names is an option (or another program's flag, FOREIGN below);
//  2. the binary's home in docs/ names every option, and every flag there is an option. Homes
//     (HOMES below): wagma-agent = the flag table of docs/agent.md (first cell of each row of the
//     table whose header starts with "flag"); wagma-train = the same kind of table in
//     docs/programs.md "## The built-in trainer as a program: `wagma-train`"; wagma-coordinator = the first code block of
//     docs/api.md "## Running the coordinator"; wagmactl = the tables and code blocks of
//     docs/wagmactl.md "## Usage" (options, and commands with their options);
//  3. invocations: everywhere users read (README.md, docs/*.md, charts/wagma/values.yaml and
//     templates/NOTES.txt), a command whose program is a binary's name or path (`wagma-agent`,
//     `/usr/local/bin/wagma-agent`, `build/agent/wagma-agent`) in a fenced code block line (with
//     its `\` continuations), in an inline code span, or on a line of NOTES.txt: each `--flag`
//     of that command, up to a shell separator (; | & # ( ) or a NOTES.txt comma), must be an
//     option of that binary. Commands of other programs (helm, kubectl, etcdctl, scripts, ...)
//     are skipped;
//  4. the chart: in charts/wagma/templates/, the `- --flag` list items after a container's
//     `command: [/usr/local/bin/<binary>]` (up to the next `command:`), with the items of the
//     _helpers.tpl defines it includes, must be options of that binary;
//  5. every other `--flag` users read (prose, inline code that is not a command, comments of
//     values.yaml and the templates) must be an option of some binary, or another program's
//     flag listed in FOREIGN;
//  6. docs/kubernetes.md "How the containers are started": each `--flag value` of a wagma
//     container's row whose value is literal (no <...>, …, |) is what `helm template` renders
//     with the default values.
// Ends with "N checks, N failures"; exit 1 on any failure.
'use strict';
const fs = require('fs');
const path = require('path');
const { execFileSync } = require('child_process');
const root = path.resolve(process.argv[2] || path.join(__dirname, '../../..'));
const build = path.resolve(process.env.WAGMA_BUILD_DIR || path.join(root, 'build'));
const tools = path.resolve(process.env.WAGMA_TOOLS_DIR || path.join(root, '.tools'));
const failures = [];
let checks = 0;
const fail = (m) => failures.push(m);
const check = (ok, m) => {
  checks++;
  if (!ok) fail(m);
};
const read = (rel) => fs.readFileSync(path.join(root, rel), 'utf8');

// Flags of other programs that the documents mention in prose (outside a command of theirs).
const FOREIGN = {
  etcd: ['--client-cert-auth', '--listen-metrics-urls', '--auth-token-ttl', '--auto-compaction-retention',
    '--quota-backend-bytes', '--snapshot-count', '--initial-cluster', '--initial-advertise-peer-urls',
    '--max-request-bytes'],
  helm: ['--set', '--set-file', '--reuse-values', '--api-versions'],
  kubectl: ['--replicas', '--force'],
  ctest: ['--output-on-failure', '--test-dir'],
  mpirun: ['--mca'],
  'bench/e2e/run.sh': ['--settings', '--algorithms', '--repeat'],
  bench_delay: ['--sgd-momentum'],
  bench_allreduce: ['--seal'],
};
const foreign = new Set(Object.values(FOREIGN).flat());
const FLAG = /(?<![\w-])--[a-z][a-z0-9-]*/g;
const flagsIn = (text) => (text.match(FLAG) || []);

// ---- the binaries and their option tables ------------------------------------------------------
const bins = new Map(); // name -> {dir, options:Set}
const SOURCES = { 'wagma-train': 'agent/trainer' }; // built to build/agent, its main elsewhere
for (const f of fs.readdirSync(path.join(root, 'docker')).filter((f) => /^Dockerfile[^.]*(\.cuda)?$/.test(f))) {
  for (const m of read(`docker/${f}`).matchAll(/COPY\s+--from=\S+\s+\/src\/build\/(\S+)\/([^/\s]+)\s+\/usr\/local\/bin\/(\S+)/g))
    if (!bins.has(m[3])) bins.set(m[3], { dir: m[1], options: null });
}
check(bins.size >= 3, `docker/: expected at least 3 installed binaries, found ${[...bins.keys()]}`);
for (const [name, b] of bins) {
  const dir = path.join(root, SOURCES[name] || b.dir);
  const opts = new Set();
  for (const f of fs.readdirSync(dir).filter((f) => f.endsWith('.c'))) {
    const src = fs.readFileSync(path.join(dir, f), 'utf8');
    // getopt_long: static [const] struct option NAME[] = { {"name", x_argument, ...}, ... };
    for (const t of src.matchAll(/struct option\s+\w+\[\]\s*=\s*\{([\s\S]*?)\};/g))
      for (const m of t[1].matchAll(/\{\s*"([a-z][a-z0-9-]*)"\s*,\s*(?:no|required|optional)_argument/g))
        opts.add(`--${m[1]}`);
    // wagmactl: static const opt_def_t opts[] = { {"--name", OPT_X, takes_value, WG_CTL_CMD_Y}, ... };
    // and its command names: [WG_CTL_CMD_LIST] = "list"
    const cmdName = new Map([...src.matchAll(/\[(WG_CTL_CMD_\w+)\]\s*=\s*"([a-z]*)"/g)].map((m) => [m[1], m[2]]));
    for (const t of src.matchAll(/opt_def_t\s+\w+\[\]\s*=\s*\{([\s\S]*?)\};/g))
      for (const m of t[1].matchAll(/\{\s*"(--[a-z][a-z0-9-]*)"\s*,\s*OPT_\w+\s*,\s*(\d)\s*,\s*(WG_CTL_CMD_\w+)/g)) {
        opts.add(m[1]);
        b.takesValue = b.takesValue || new Set();
        b.only = b.only || new Map();
        if (m[2] === '1') b.takesValue.add(m[1]);
        if (cmdName.get(m[3])) b.only.set(m[1], cmdName.get(m[3])); // a command's own option
        b.commands = new Set([...(b.commands || []), ...[...cmdName.values()].filter(Boolean)]);
      }
  }
  check(opts.size > 0, `${name}: no option table found in ${b.dir}/*.c (teach tests/integration/docs/doc_flags.cjs)`);
  b.options = opts;
}
const allOptions = new Set([...bins.values()].flatMap((b) => [...b.options]));
const binOf = (word) => {
  const base = path.basename(word || '');
  return bins.has(base) ? base : null;
};

// ---- 1. --help ---------------------------------------------------------------------------------
for (const [name, b] of bins) {
  const exe = path.join(build, b.dir, name);
  let out = '';
  try {
    out = execFileSync(exe, ['--help'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 10000 });
  } catch (e) {
    fail(`${name} --help: ${e.message.split('\n')[0]} (build it: ${exe})`);
    continue;
  }
  const said = new Set(flagsIn(out));
  for (const o of b.options) check(said.has(o), `${name} --help does not mention its option ${o}`);
  for (const f of said) check(b.options.has(f) || foreign.has(f), `${name} --help mentions ${f}, which is not an option of ${name}`);
}

// ---- markdown helpers --------------------------------------------------------------------------
// Splits a markdown text into {kind: 'code'|'prose', text, line} pieces: fenced code lines and
// the rest (prose lines).
function mdLines(text) {
  const out = [];
  let fence = null;
  text.split('\n').forEach((l, i) => {
    const m = l.match(/^\s*(```+|~~~+)/);
    if (m) {
      if (!fence) fence = m[1];
      else if (l.trim().startsWith(fence)) fence = null;
      return;
    }
    out.push({ kind: fence ? 'code' : 'prose', text: l, line: i + 1 });
  });
  return out;
}
// Joins code lines ending in a backslash with the next.
function joinContinuations(lines) {
  const out = [];
  for (const l of lines) {
    const prev = out[out.length - 1];
    if (prev && prev.kind === 'code' && l.kind === 'code' && /\\\s*$/.test(prev.text))
      prev.text = prev.text.replace(/\\\s*$/, ' ') + l.text;
    else out.push({ ...l });
  }
  return out;
}
// The commands of a shell line: [{program, args}] split at ; | & # ( ) (a `\|` stays: it is a
// markdown table's literal pipe, e.g. `cpu\|cuda`).
function commands(text) {
  // `\|` is a table's literal pipe; $(NAME) a Kubernetes variable, not a command substitution
  const t = text.replace(/\\\|/g, '\u0001').replace(/\$\(([A-Z_][A-Z0-9_]*)\)/g, '\u0002$1\u0003');
  return t.split(/\s#|[;|&)`]|\$\(/).map((c) => {
    const words = c.replace(/\u0001/g, '|').replace(/\u0002/g, '$(').replace(/\u0003/g, ')').trim().split(/\s+/).filter(Boolean);
    while (words.length && (/^[A-Z_][A-Z0-9_]*=/.test(words[0]) || ['$', 'sudo', 'exec', 'env', 'time'].includes(words[0])))
      words.shift();
    return { program: words[0] || '', args: words.slice(1).join(' ') };
  });
}

// ---- 2. homes ----------------------------------------------------------------------------------
function section(text, title) {
  const parts = text.split(/^(?=## )/m);
  return parts.find((p) => p.startsWith(`## ${title}\n`)) || null;
}
// The first cells of the first table whose header starts with "flag" in text.
function flagTable(text) {
  const out = [];
  let inTable = false;
  for (const l of (text || '').split('\n')) {
    if (/^\|\s*flag\s*\|/.test(l)) inTable = true;
    else if (inTable && !l.startsWith('|')) break;
    else if (inTable) out.push(...flagsIn(l.split('|')[1] || ''));
  }
  return out;
}
const HOMES = {
  'wagma-agent': { file: 'docs/agent.md', flags: flagTable },
  'wagma-train': {
    file: 'docs/programs.md',
    flags: (text) => flagTable(section(text, 'The built-in trainer as a program: `wagma-train`')),
  },
  'wagma-coordinator': {
    file: 'docs/api.md',
    flags: (text) => {
      const sec = section(text, 'Running the coordinator');
      if (!sec) return [];
      const code = mdLines(sec).filter((l) => l.kind === 'code');
      const first = [];
      for (const l of code) {
        if (first.length && l.line !== first[first.length - 1].line + 1) break;
        first.push(l);
      }
      return first.flatMap((l) => flagsIn(l.text));
    },
  },
  wagmactl: {
    file: 'docs/wagmactl.md',
    flags: (text) => {
      const sec = section(text, 'Usage');
      if (!sec) return [];
      return mdLines(sec)
        .filter((l) => l.kind === 'code' || l.text.startsWith('|'))
        .flatMap((l) => flagsIn(l.kind === 'code' ? l.text : l.text.split('|')[1] || ''));
    },
  },
};
for (const [name, b] of bins) {
  const h = HOMES[name];
  if (!h) {
    fail(`${name}: no documentation home in tests/integration/docs/doc_flags.cjs HOMES (say where its flags are documented)`);
    continue;
  }
  const documented = new Set(h.flags(read(h.file)));
  check(documented.size > 0, `${h.file}: the flags of ${name} were not found where this test looks (${name}'s home)`);
  for (const o of b.options) check(documented.has(o), `${h.file} does not document ${name}'s option ${o}`);
  for (const f of documented) check(b.options.has(f), `${h.file} documents ${f} for ${name}, which has no such option`);
}

// ---- 3 and 5. invocations and prose ------------------------------------------------------------
const proseFlag = (file, line, f, where) =>
  check(allOptions.has(f) || foreign.has(f), `${file}:${line}: ${f} (${where}) is not an option of any wagma binary` +
    ` (${[...bins.keys()].join(', ')}) nor a known flag of another program`);
const invocation = (file, line, bin, args) => {
  const b = bins.get(bin);
  for (const f of flagsIn(args)) check(b.options.has(f), `${file}:${line}: \`${bin} ... ${f}\`: ${bin} has no option ${f}`);
  if (!b.only) return;
  // wagmactl: a command's own option goes with that command (when the command is named)
  let command = null;
  const used = [];
  const words = args.split(/\s+/).map((w) => w.replace(/^[[(]+|[\]),]+$/g, '')).filter(Boolean);
  for (let k = 0; k < words.length; k++) {
    const w = words[k];
    if (w.startsWith('--')) {
      const f = w.split('=')[0];
      used.push(f);
      if (b.takesValue.has(f) && !w.includes('=')) k++;
    } else if (command === null) command = w;
  }
  if (!b.commands.has(command)) return;
  for (const f of used)
    if (b.only.has(f)) check(b.only.get(f) === command, `${file}:${line}: \`${bin} ${command} ... ${f}\`: ${f} is an option of \`${bin} ${b.only.get(f)}\` only`);
};
function scanShell(file, line, text, where) {
  for (const c of commands(text)) {
    const bin = binOf(c.program);
    if (bin) invocation(file, line, bin, c.args);
    else if (c.program.startsWith('--')) for (const f of flagsIn(`${c.program} ${c.args}`)) proseFlag(file, line, f, where);
    // else: another program's command; its flags are its own
  }
}
const docs = ['README.md', ...fs.readdirSync(path.join(root, 'docs')).filter((f) => f.endsWith('.md')).map((f) => `docs/${f}`)];
for (const file of docs) {
  const lines = joinContinuations(mdLines(read(file)));
  for (let i = 0; i < lines.length; i++) {
    const l = lines[i];
    if (l.kind === 'code') {
      scanShell(file, l.line, l.text, 'code block');
      continue;
    }
    // a paragraph (prose lines up to a blank line or a table row): its inline code spans may
    // cross line ends. Each span is a command or mentions flags; the rest is prose.
    const para = [l];
    const isRow = (x) => x.text.trimStart().startsWith('|');
    while (!isRow(l) && l.text.trim() && i + 1 < lines.length && lines[i + 1].kind === 'prose' &&
           lines[i + 1].text.trim() && !isRow(lines[i + 1]))
      para.push(lines[++i]);
    const text = para.map((x) => x.text).join('\n');
    const lineAt = (off) => para[0].line + (text.slice(0, off).match(/\n/g) || []).length;
    const rest = text.replace(/(`+)([\s\S]*?)\1/g, (all, tick, span, off) => {
      scanShell(file, lineAt(off), span.replace(/\n/g, ' '), 'inline code');
      return ' '.repeat(all.length).replace(/ /g, (_, k) => (all[k] === '\n' ? '\n' : ' '));
    });
    for (const m of rest.matchAll(FLAG)) proseFlag(file, lineAt(m.index), m[0], 'prose');
  }
}
// NOTES.txt: plain text; a command starts at a program's name anywhere on a line
{
  const file = 'charts/wagma/templates/NOTES.txt';
  read(file).split('\n').forEach((text, i) => {
    const t = text.replace(/\{\{[\s\S]*?\}\}/g, 'X');
    let rest = t;
    const progs = /(?<![\w/.-])((?:\/[\w.-]+)*\/?(wagma-coordinator|wagma-agent|wagmactl|kubectl|helm|curl|etcdctl))\b([^;|&#(),]*)/g;
    rest = t.replace(progs, (all, prog, base, args) => {
      if (bins.has(base)) invocation(file, i + 1, base, args);
      return ' ';
    });
    for (const f of flagsIn(rest)) proseFlag(file, i + 1, f, 'prose');
  });
}
// values.yaml and the templates' comments: prose
{
  const file = 'charts/wagma/values.yaml';
  read(file).split('\n').forEach((text, i) => {
    const c = text.indexOf('#');
    if (c < 0) return;
    const comment = text.slice(c + 1);
    // "wagma-agent --device cpu" inside a comment is an invocation
    const rest = comment.replace(/\b(wagma-coordinator|wagma-agent|wagmactl)\b((?:\s+--[a-z][a-z0-9-]*(?:\s+[a-z0-9./:-]+)?)+)/g, (all, base, args) => {
      if (bins.has(base)) invocation(file, i + 1, base, args);
      return ' ';
    });
    for (const f of flagsIn(rest)) proseFlag(file, i + 1, f, 'comment');
  });
}

// ---- 4. the chart's templates ------------------------------------------------------------------
const tdir = path.join(root, 'charts/wagma/templates');
const helpers = fs.readFileSync(path.join(tdir, '_helpers.tpl'), 'utf8');
const defines = new Map(); // name -> flags of its `- --flag` items
{
  const re = /\{\{-?\s*define\s+"([^"]+)"\s*-?\}\}/g;
  let m;
  while ((m = re.exec(helpers))) {
    // the define's body: up to its matching {{ end }}
    let depth = 1;
    const tok = /\{\{-?\s*(if|with|range|define|block|end)\b[^}]*\}\}/g;
    tok.lastIndex = re.lastIndex;
    let t;
    let end = helpers.length;
    while ((t = tok.exec(helpers))) {
      depth += t[1] === 'end' ? -1 : 1;
      if (depth === 0) {
        end = t.index;
        break;
      }
    }
    const body = helpers.slice(re.lastIndex, end);
    const flags = [];
    for (const line of body.split('\n')) {
      const it = line.match(/^\s*-\s+"?(--[a-z][a-z0-9-]*)/);
      if (it) flags.push(it[1]);
    }
    defines.set(m[1], flags);
  }
}
for (const f of fs.readdirSync(tdir).filter((f) => /\.(yaml|tpl)$/.test(f))) {
  const file = `charts/wagma/templates/${f}`;
  let bin = null;
  let foreignProgram = false;
  read(file).split('\n').forEach((line, i) => {
    const cmd = line.match(/^\s*command:\s*\[?\s*"?([^\]"\s]+)/);
    if (cmd) {
      bin = binOf(cmd[1]);
      foreignProgram = !bin;
      return;
    }
    const comment = line.match(/^\s*#(.*)$/) || line.match(/\{\{-?\s*\/\*([\s\S]*?)\*\/\s*-?\}\}/);
    if (comment) {
      for (const fl of flagsIn(comment[1])) proseFlag(file, i + 1, fl, 'template comment');
      return;
    }
    if (f === '_helpers.tpl') return; // defines are checked where they are included
    const item = line.match(/^\s*-\s+"?(--[a-z][a-z0-9-]*)/);
    if (item && bin) check(bins.get(bin).options.has(item[1]), `${file}:${i + 1}: ${bin} is given ${item[1]}, which it has no option for`);
    else if (item && !foreignProgram) fail(`${file}:${i + 1}: ${item[1]} outside a container's args (no command: line above)`);
    for (const inc of line.matchAll(/include\s+"([^"]+)"/g)) {
      if (!bin || !defines.has(inc[1])) continue;
      for (const fl of defines.get(inc[1]))
        check(bins.get(bin).options.has(fl), `${file}:${i + 1}: ${bin} is given ${fl} (from "${inc[1]}" in _helpers.tpl), which it has no option for`);
    }
  });
}

// ---- 6. docs/kubernetes.md's container table against the rendered chart ------------------------
{
  const helm = path.join(tools, 'bin', 'helm');
  let rendered = null;
  try {
    rendered = execFileSync(helm, ['template', 'wagma', path.join(root, 'charts/wagma'), '--namespace', 'ml'],
      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 60000 });
  } catch (e) {
    fail(`helm template failed (${helm}; scripts/deps.sh installs it): ${e.message.split('\n')[0]}`);
  }
  if (rendered) {
    const YAML = require(path.join(tools, 'node_modules', 'yaml'));
    const argsOf = new Map(); // binary -> rendered args
    for (const d of YAML.parseAllDocuments(rendered)) {
      const o = d.toJSON();
      const cs = o && o.spec && o.spec.template && o.spec.template.spec && o.spec.template.spec.containers;
      for (const c of cs || []) {
        const bin = binOf((c.command || [])[0]);
        if (bin && !argsOf.has(bin)) argsOf.set(bin, (c.args || []).map(String));
      }
    }
    const md = read('docs/kubernetes.md');
    const lines = md.split('\n');
    const start = lines.findIndex((l) => l.startsWith('### How the containers are started'));
    check(start >= 0, 'docs/kubernetes.md has no "### How the containers are started"');
    let seen = 0;
    for (let i = start + 1; i < lines.length && !/^#/.test(lines[i]); i++) {
      for (const span of lines[i].matchAll(/`([^`]+)`/g)) {
        const c = commands(span[1])[0];
        const bin = binOf(c.program);
        if (!bin || !argsOf.has(bin)) continue;
        seen++;
        const words = c.args.split(/\s+/);
        const got = argsOf.get(bin);
        for (let k = 0; k < words.length; k++) {
          const f = words[k];
          if (!/^--[a-z]/.test(f)) continue;
          const v = words[k + 1];
          const at = got.indexOf(f);
          check(at >= 0 || (v && v.startsWith('--')), `docs/kubernetes.md:${i + 1}: ${bin} ${f}: the chart does not pass it with the default values`);
          if (!v || v.startsWith('--') || /[<>…|]/.test(v) || at < 0) continue;
          check(got[at + 1] === v, `docs/kubernetes.md:${i + 1}: ${bin} ${f} ${v}: the chart renders ${f} ${got[at + 1]}`);
        }
      }
    }
    check(seen >= 2, `docs/kubernetes.md "How the containers are started": found ${seen} wagma commands, expected the coordinator's and the agent's`);
  }
}

for (const f of failures) console.log(`FAIL ${f}`);
console.log(`test_docs_flags: ${[...bins].map(([n, b]) => `${n} (${b.options.size} options)`).join(', ')}: ` +
  `${checks} checks, ${failures.length} failures`);
process.exit(failures.length ? 1 : 0);
