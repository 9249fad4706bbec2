#!/bin/sh
# docker/runtime-packages.sh EXECUTABLE... — prints the Debian packages (one a line) that hold
# the shared libraries the executables load, so a runtime image installs exactly what the build
# linked (the Dockerfiles run it in their build stage). Fails when a library is not found or no
# installed package holds it. WAGMA_RUNTIME_IGNORE: a path prefix whose libraries are skipped
# (tests/integration/chart runs it on a machine whose CUDA is not a Debian package).
set -eu
out=$(ldd "$@")
if printf '%s\n' "$out" | grep -q 'not found'; then
  printf '%s\n' "$out" | grep 'not found' >&2
  exit 1
fi
libs=""
for lib in $(printf '%s\n' "$out" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u); do
  if [ -n "${WAGMA_RUNTIME_IGNORE:-}" ]; then
    case "$lib" in "$WAGMA_RUNTIME_IGNORE"*) continue ;; esac
  fi
  libs="$libs $lib"
done
# merged /usr: a package may list a file under /lib or /usr/lib, by its name or its target
candidates() {
  real=$(readlink -f "$1")
  printf '%s\n' "$1" "$real" "/usr$1" "${1#/usr}" "/usr$real" "${real#/usr}"
}
all=$(for lib in $libs; do candidates "$lib"; done | sort -u)
# shellcheck disable=SC2086
owners=$(dpkg-query -S $all 2>/dev/null || true) # "pkg[, pkg2]: /path" lines
packages=""
for lib in $libs; do
  owner=""
  for f in $(candidates "$lib"); do
    owner=$(printf '%s\n' "$owners" | awk -v f="$f" 'index($0, ": " f) && substr($0, index($0, ": ") + 2) == f { sub(/: .*/, ""); sub(/,.*/, ""); print; exit }')
    [ -n "$owner" ] && break
  done
  if [ -z "$owner" ]; then
    echo "runtime-packages: no installed package holds $lib" >&2
    exit 1
  fi
  packages="$packages $owner"
done
printf '%s\n' $packages | sort -u
