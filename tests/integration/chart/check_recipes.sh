#!/usr/bin/env bash
# tests/integration/chart/check_recipes.sh ROOT BUILD DEFAULT.yaml GPU.yaml — the container
# recipes (docker/Dockerfile, docker/Dockerfile.cuda) are not built here (no container engine);
# this keeps them consistent with what can be checked:
#   - the build: they run scripts/deps.sh and configure CMake as scripts/test.sh does
#     (RelWithDebInfo, -Werror; CUDA OFF for the CPU file, ON for the CUDA one), build targets
#     that exist, and copy build outputs that exist in BUILD;
#   - docker/runtime-packages.sh finds the Debian package of every library this build's
#     executables load (what the runtime stages install);
#   - the chart (rendered DEFAULT.yaml and GPU.yaml): every container command is a file the image
#     of its target installs, the images run as the chart's non-root uid, the agent's working
#     directory is the chart's checkpoint mount, the data directory is where the image's
#     dataset-fashion-mnist puts it, the exposed ports are the chart's.
set -uo pipefail
root=$1 build=$2 default=$3 gpu=$4
tools=${WAGMA_TOOLS_DIR:-$root/.tools}
bad=0
no() { echo "check_recipes: $*"; bad=1; }

testsh=$root/scripts/test.sh
grep -q -- '-DCMAKE_BUILD_TYPE=RelWithDebInfo' "$testsh" || no "scripts/test.sh no longer builds RelWithDebInfo: update docker/"
grep -q -- '-DWAGMA_WERROR=' "$testsh" || no "scripts/test.sh no longer sets WAGMA_WERROR: update docker/"

stage_of() { # FILE TARGET -> the lines of that stage
  awk -v t="$2" 'tolower($1) == "from" { on = (tolower($NF) == t) } on' "$1"
}

# the executables the CMake build defines (read from the sources: the shared build folder may be
# rebuilt by someone else meanwhile)
targets=$(cd "$root" && git ls-files -co --exclude-standard -- '*CMakeLists.txt' | xargs grep -h 'add_executable(' 2>/dev/null)
for f in Dockerfile Dockerfile.cuda; do
  df=$root/docker/$f
  [ -f "$df" ] || { no "docker/$f is missing"; continue; }
  [ -f "$df.dockerignore" ] || no "docker/$f.dockerignore is missing"
  grep -q 'scripts/deps.sh' "$df" || no "docker/$f does not install with scripts/deps.sh"
  grep -q 'cmake -S \. -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWAGMA_WERROR=ON' "$df" ||
    no "docker/$f does not configure as scripts/test.sh does"
  want=OFF
  [ "$f" = Dockerfile.cuda ] && want=ON
  grep -q -- "-DWAGMA_WITH_CUDA=$want" "$df" || no "docker/$f: WAGMA_WITH_CUDA is not $want"
  # the targets it builds exist in this build (the generator knows them)
  for t in $(sed -n 's/.*--target \(.*\) \\$/\1/p' "$df"); do
    grep -qE "add_executable\($t[ )]" <<<"$targets" ||
      no "docker/$f builds target $t, which no CMakeLists.txt defines"
  done
  # every build output it copies exists here
  for p in $(sed -n 's#^COPY --from=build /src/build/\([^ ]*\) .*#\1#p' "$df"); do
    [ -x "$build/$p" ] || no "docker/$f copies build/$p, which the build does not make ($build/$p)"
  done
  for target in coordinator agent; do
    s=$(stage_of "$df" "$target")
    [ -n "$s" ] || { no "docker/$f has no stage $target"; continue; }
    grep -q '^USER 65532:65532$' <<<"$s" || no "docker/$f $target: not USER 65532:65532"
    bin=/usr/local/bin/wagma-$target
    grep -q "^COPY --from=build .* $bin\$" <<<"$s" || no "docker/$f $target: does not install $bin"
    grep -q "^ENTRYPOINT \[\"$bin\"\]" <<<"$s" || no "docker/$f $target: ENTRYPOINT is not $bin"
  done
  grep -q '^WORKDIR /var/lib/wagma$' <<<"$(stage_of "$df" agent)" || no "docker/$f agent: WORKDIR is not /var/lib/wagma"
  grep -q 'dataset-fashion-mnist' <<<"$(stage_of "$df" agent)" || no "docker/$f agent: no Fashion-MNIST"
  grep -q '^EXPOSE 8080$' <<<"$(stage_of "$df" coordinator)" || no "docker/$f coordinator: EXPOSE is not 8080"
  grep -q '^EXPOSE 7000$' <<<"$(stage_of "$df" agent)" || no "docker/$f agent: EXPOSE is not 7000"
done

# what the runtime stages install: every library of this build's executables has a package
ignore=""
if grep -q '/usr/local/cuda' <<<"$(ldd "$build/agent/wagma-agent")" && ! dpkg-query -S libcudart.so >/dev/null 2>&1; then
  ignore=/usr/local/cuda # this machine's CUDA is no Debian package (Dockerfile.cuda installs NVIDIA's)
fi
WAGMA_RUNTIME_IGNORE=$ignore "$root/docker/runtime-packages.sh" "$build/coordinator/wagma-coordinator" >/dev/null ||
  no "docker/runtime-packages.sh: not every library of wagma-coordinator has a package"
WAGMA_RUNTIME_IGNORE=$ignore "$root/docker/runtime-packages.sh" "$build/agent/wagma-agent" "$build/api/wagmactl/wagmactl" >/dev/null ||
  no "docker/runtime-packages.sh: not every library of wagma-agent, wagmactl has a package"

# the chart against the recipes
facts=$(WAGMA_TOOLS_DIR=$tools node -e '
const path = require("path"), fs = require("fs");
const YAML = require(path.resolve(process.env.WAGMA_TOOLS_DIR, "node_modules/yaml"));
for (const f of process.argv.slice(1)) for (const d of YAML.parseAllDocuments(fs.readFileSync(f, "utf8"), { version: "1.1" })) {
  const o = d.toJS();
  if (!o || !o.spec || !o.spec.template) continue;
  const p = o.spec.template.spec;
  for (const c of p.containers) {
    const arg = (n) => { const i = (c.args || []).indexOf(n); return i >= 0 ? c.args[i + 1] : ""; };
    const port = (c.ports || [])[0] || {};
    console.log([c.name, o.metadata.name, c.image, c.command[0], p.securityContext.runAsUser,
      c.workingDir || "-", arg("--data-dir") || "-", port.containerPort || "-"].join(" "));
  }
}' "$default" "$gpu")
while read -r name obj image cmd uid wd data port; do
  case $name in
    etcd) continue ;; # the etcd image's own binary
    coordinator) target=coordinator ;;
    agent) target=agent ;;
    *) no "unknown container $name in $obj"; continue ;;
  esac
  df=$root/docker/Dockerfile
  [[ $image == *-cuda\" || $image == *-cuda ]] && df=$root/docker/Dockerfile.cuda
  s=$(stage_of "$df" "$target")
  grep -q "^COPY --from=build .* $cmd\$" <<<"$s" || no "$obj: command $cmd is not installed by $(basename "$df") $target"
  grep -q "^USER $uid:" <<<"$s" || no "$obj: runs as uid $uid, $(basename "$df") $target as $(sed -n 's/^USER //p' <<<"$s")"
  grep -q "^EXPOSE $port\$" <<<"$s" || no "$obj: port $port is not what $(basename "$df") $target exposes"
  if [ "$target" = agent ]; then
    grep -q "^WORKDIR $wd\$" <<<"$s" || no "$obj: workingDir $wd is not the image's WORKDIR"
    dpkg-query -L dataset-fashion-mnist 2>/dev/null | grep -qx "$data" ||
      no "$obj: --data-dir $data is not where dataset-fashion-mnist puts the data"
  fi
done <<<"$facts"
[ -n "$facts" ] || no "no containers found in the rendered chart"
exit $bad
