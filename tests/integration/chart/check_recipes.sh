#!/usr/bin/env bash
# tests/integration/chart/check_recipes.sh ROOT BUILD DEFAULT.yaml GPU.yaml PROGRAMS.yaml — the
# container recipes (docker/Dockerfile, docker/Dockerfile.cuda, docker/Dockerfile.program-example)
# are not built here (no container engine); this keeps them consistent with what can be checked:
#   - the build: they run scripts/deps.sh and configure CMake as scripts/test.sh does
#     (RelWithDebInfo, -Werror; CUDA OFF for the CPU file, ON for the CUDA one), build targets
#     that exist, and copy build outputs that exist in BUILD;
#   - docker/runtime-packages.sh finds the Debian package of every library this build's
#     executables load (what the runtime stages install);
#   - the chart (rendered DEFAULT.yaml and GPU.yaml): every container command is a file the image
#     of its target installs, the images run as the chart's non-root uid, the agent's working
#     directory is the chart's checkpoint mount, the data directory is where the image's
#     dataset-fashion-mnist puts it, the exposed ports are the chart's;
#   - the program example (PROGRAMS.yaml: the chart rendered with agents.programs.enabled): it is
#     layered on the agent image, which carries libwagma.so.0 on the loader's path; it copies the
#     program into the chart's --programs directory, executable, with a shebang this machine's
#     Debian Python runs, and the Python package; its .dockerignore lets those files through.
set -uo pipefail
root=$1 build=$2 default=$3 gpu=$4 programs=$5
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
targets=$(cd "$root" && git ls-files -co --exclude-standard -- '*CMakeLists.txt' | xargs grep -hE 'add_(executable|library)\(' 2>/dev/null)
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
    grep -qE "add_(executable|library)\($t[ )]" <<<"$targets" ||
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
  # the agent launches wagma-train from its own directory for every built-in job
  grep -q '^COPY --from=build /src/build/agent/wagma-train /usr/local/bin/wagma-train$' <<<"$(stage_of "$df" agent)" ||
    no "docker/$f agent: does not install wagma-train beside /usr/local/bin/wagma-agent"
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
WAGMA_RUNTIME_IGNORE=$ignore "$root/docker/runtime-packages.sh" "$build/worker/libwagma.so.0" >/dev/null ||
  no "docker/runtime-packages.sh: not every library of libwagma.so.0 has a package"

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

# the program example, layered on docker/Dockerfile's agent image
agent=$(stage_of "$root/docker/Dockerfile" agent)
grep -q '^COPY --from=build /libwagma.so.0 /usr/local/lib/libwagma.so.0$' <<<"$agent" &&
  grep -q 'ldconfig' <<<"$agent" && grep -q 'cp -L build/worker/libwagma.so.0 /libwagma.so.0' "$root/docker/Dockerfile" ||
  no "docker/Dockerfile agent: does not install this build's libwagma.so.0 in /usr/local/lib and run ldconfig"
[ -e "$build/worker/libwagma.so.0" ] || no "the build makes no worker/libwagma.so.0 ($build/worker/libwagma.so.0)"
df=$root/docker/Dockerfile.program-example
if [ ! -f "$df" ]; then
  no "docker/Dockerfile.program-example is missing"
else
  appv=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$root/charts/wagma/Chart.yaml")
  grep -q "^ARG AGENT_IMAGE=wagma/agent:$appv\$" "$df" && grep -q '^FROM ${AGENT_IMAGE}$' "$df" ||
    no "docker/Dockerfile.program-example: not FROM \${AGENT_IMAGE} (ARG AGENT_IMAGE=wagma/agent:$appv, the chart's agent image)"
  dir=$(WAGMA_TOOLS_DIR=$tools node -e '
const path = require("path"), fs = require("fs");
const YAML = require(path.resolve(process.env.WAGMA_TOOLS_DIR, "node_modules/yaml"));
for (const d of YAML.parseAllDocuments(fs.readFileSync(process.argv[1], "utf8"), { version: "1.1" })) {
  const o = d.toJS();
  const c = o && o.kind === "StatefulSet" && o.spec.template.spec.containers.find((x) => x.name === "agent");
  const i = c ? c.args.indexOf("--programs") : -1;
  if (i >= 0) { console.log(c.args[i + 1]); break; }
}' "$programs")
  [ -n "$dir" ] || no "$programs: no agent with --programs"
  grep -q "^ARG PROGRAMS=$dir\$" "$df" || no "docker/Dockerfile.program-example: ARG PROGRAMS is not the chart's --programs $dir"
  grep -q '^COPY examples/pytorch/fmnist_cnn.py ${PROGRAMS}/fmnist_cnn$' "$df" && grep -q 'chmod 0755 ${PROGRAMS}/fmnist_cnn' "$df" ||
    no "docker/Dockerfile.program-example: does not install examples/pytorch/fmnist_cnn.py as \${PROGRAMS}/fmnist_cnn, mode 0755"
  grep -q '^COPY python/wagma /usr/lib/python3/dist-packages/wagma$' "$df" ||
    no "docker/Dockerfile.program-example: does not install python/wagma where Debian's python3 finds it"
  grep -q '^USER 65532:65532$' "$df" || no "docker/Dockerfile.program-example: does not return to USER 65532:65532"
  for pkg in python3 python3-numpy python3-torch; do
    grep -qE "apt-get install .*[ ]$pkg( |$)" "$df" || no "docker/Dockerfile.program-example: does not install $pkg"
  done
  # the program runs by its shebang, without the agent's environment (docs/programs.md, Launch)
  shebang=$(head -n1 "$root/examples/pytorch/fmnist_cnn.py")
  [ "$shebang" = '#!/usr/bin/python3' ] || no "examples/pytorch/fmnist_cnn.py: shebang $shebang, the example image installs /usr/bin/python3"
  [ -f "$df.dockerignore" ] || no "docker/Dockerfile.program-example.dockerignore is missing"
  for src in python/wagma examples/pytorch/fmnist_cnn.py; do
    [ -e "$root/$src" ] || no "docker/Dockerfile.program-example copies $src, which is missing"
    grep -qx "!$src" "$df.dockerignore" || no "docker/Dockerfile.program-example.dockerignore does not let $src through"
  done
fi
exit $bad
