#!/usr/bin/env bash
# tests/integration/chart/test_chart.sh — the static checks of charts/wagma (ctest test_chart):
#   1. helm lint --strict, with the default values and with each scenario's;
#   2. helm template for each scenario (default, GPU agents, 3-member etcd, external etcd, etcd
#      over TLS with a user, an existing token Secret, the ServiceMonitor with and without its CRD,
#      programs from a volume and from the image), every object checked
#      by k8s_check.cjs: Kubernetes schemas, unknown fields, the chart's rules, the scenario;
#   3. each file of bad-values/ is rejected by values.schema.json with the message its
#      "# expect:" line gives;
#   4. values.yaml documents every knob, NOTES.txt renders, the container recipes match the
#      chart and the build, docs/kubernetes.md's REST reference matches api/openapi.yaml.
# Tools come from .tools/ (scripts/deps.sh installs them). Ends with "N passed, N failed".
#   WAGMA_BUILD_DIR   the CMake build folder (for the binaries the Dockerfiles copy)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
tools=${WAGMA_TOOLS_DIR:-$root/.tools}
helm=$tools/bin/helm
chart=$root/charts/wagma
build=${WAGMA_BUILD_DIR:-$root/build}
if [ ! -x "$helm" ] || [ ! -d "$tools/node_modules/kubernetes-models" ]; then
  echo "test_chart: helm or kubernetes-models missing in $tools: run scripts/deps.sh" >&2
  exit 1
fi
export WAGMA_TOOLS_DIR=$tools
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   $1"; }
ko() { failed=$((failed + 1)); echo "FAIL $1"; }
start=$(date +%s.%N)

# scenario name | values file | extra helm flags
scenarios=(
  "default||"
  "gpu|values/gpu.yaml|"
  "etcd3|values/etcd3.yaml|"
  "external-etcd|values/external-etcd.yaml|"
  "etcd-client|values/etcd-client.yaml|"
  "etcd-client-inline|values/etcd-client-inline.yaml|"
  "existing-secret|values/existing-secret.yaml|"
  "servicemonitor-on|values/servicemonitor.yaml|--api-versions monitoring.coreos.com/v1/ServiceMonitor"
  "servicemonitor-no-crd|values/servicemonitor.yaml|"
  "options|values/options.yaml|"
  "no-agents||--set agents.cpu.enabled=false"
  "programs|values/programs.yaml|"
  "programs-in-image||--set agents.programs.enabled=true"
)

# ---- 1. lint (each values file once; lint takes no --api-versions) --------------------------------
linted=" "
for s in "${scenarios[@]}"; do
  IFS='|' read -r name values extra <<<"$s"
  [[ $linted == *" $values "* ]] && continue
  linted+="$values "
  args=()
  [ -n "$values" ] && args+=(-f "$here/$values")
  if out=$("$helm" lint --strict "$chart" "${args[@]}" 2>&1); then
    ok "helm lint --strict ($name)"
  else
    echo "$out"
    ko "helm lint --strict ($name)"
  fi
done

# ---- 2. template + validate ---------------------------------------------------------------------
for s in "${scenarios[@]}"; do
  IFS='|' read -r name values extra <<<"$s"
  args=(--namespace ml)
  [ -n "$values" ] && args+=(-f "$here/$values")
  # shellcheck disable=SC2206
  [ -n "$extra" ] && args+=($extra)
  if ! "$helm" template wagma "$chart" "${args[@]}" >"$tmp/$name.yaml" 2>"$tmp/$name.err"; then
    cat "$tmp/$name.err"
    ko "helm template ($name)"
    continue
  fi
  if node "$here/k8s_check.cjs" "$name" "$tmp/$name.yaml"; then
    ok "helm template + objects valid ($name)"
  else
    ko "helm template + objects valid ($name)"
  fi
done

# ---- 3. values the schema rejects -----------------------------------------------------------------
for f in "$here"/bad-values/*.yaml; do
  want=$(sed -n 's/^# expect: //p' "$f" | head -n1)
  if "$helm" template wagma "$chart" -f "$f" >/dev/null 2>"$tmp/bad.err"; then
    ko "bad values rejected: $(basename "$f") (helm template accepted it)"
  elif ! grep -qF "values don't meet the specifications of the schema" "$tmp/bad.err" ||
       ! grep -qF -- "$want" "$tmp/bad.err"; then
    cat "$tmp/bad.err"
    ko "bad values rejected: $(basename "$f") (message lacks: $want)"
  else
    ok "bad values rejected: $(basename "$f"): $(grep -F -- "$want" "$tmp/bad.err" | head -n1 | sed 's/^ *- //' | cut -c1-90)"
  fi
done

# ---- 4. documentation, NOTES, recipes, REST reference ---------------------------------------------
if node "$here/chart_docs.cjs" "$root"; then
  ok "values.yaml documents every knob; docs/kubernetes.md REST reference = api/openapi.yaml"
else
  ko "values.yaml documents every knob; docs/kubernetes.md REST reference = api/openapi.yaml"
fi

notes() { "$helm" install wagma "$chart" --dry-run=client --namespace ml "$@" 2>&1 | sed -n '/^NOTES:/,$p'; }
n=$(notes)
if grep -q "port-forward svc/wagma-coordinator 8080:8080" <<<"$n" &&
   grep -q "get secret wagma-token" <<<"$n" && grep -q "4 CPU agent(s)" <<<"$n"; then
  ok "NOTES.txt: how to reach the API, the token"
else
  echo "$n"
  ko "NOTES.txt: how to reach the API, the token"
fi
n=$(notes -f "$here/values/servicemonitor.yaml")
if grep -q "has no ServiceMonitor CRD" <<<"$n"; then
  ok "NOTES.txt: a ServiceMonitor skipped for want of the CRD says so"
else
  echo "$n"
  ko "NOTES.txt: a ServiceMonitor skipped for want of the CRD says so"
fi

if "$here/check_recipes.sh" "$root" "$build" "$tmp/default.yaml" "$tmp/gpu.yaml" "$tmp/programs-in-image.yaml"; then
  ok "docker/: recipes match the chart (commands, paths, user) and the build (deps.sh, CMake, outputs)"
else
  ko "docker/: recipes match the chart (commands, paths, user) and the build (deps.sh, CMake, outputs)"
fi

end=$(date +%s.%N)
awk -v a="$start" -v b="$end" 'BEGIN { printf "test_chart: %.1f s\n", b - a }'
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
