#!/bin/sh
# Make the lab's container image localhost/inferops-lab/standin:1 offline, from the guest's own files:
# python3 (the binary, its stdlib without test dirs, lib-dynload and every shared library these load),
# /etc/passwd and /etc/group. No registry, no network. Idempotent: prints "exists" and exits 0 when the image
# is there, "created" after making it (a playbook's changed_when can test that word).
# Usage: make_standin_image.sh [IMAGE [PROGRAM...]]   (POSIX sh; run as root in the guest, which has podman)
# Each PROGRAM (an ELF file, such as /opt/llama.cpp/bin/llama-server) goes in at its own path with its libraries.
set -eu
image=${1:-localhost/inferops-lab/standin:1}
[ $# -gt 0 ] && shift
if podman image exists "$image"; then
    echo exists
    exit 0
fi
py=$(readlink -f /usr/bin/python3)          # /usr/bin/python3.11
ver=$(basename "$py")                        # python3.11
stdlib=/usr/lib/$ver
ldso=/lib64/ld-linux-x86-64.so.2
list=$(mktemp)
trap 'rm -f "$list"' EXIT INT TERM
# A path as the archive must hold it: its directory with symlinks resolved (merged /usr: /lib -> usr/lib), and the
# file itself (often a symlink, e.g. libz.so.1) plus what it finally points to.
add() {
    dir=$(cd "$(dirname "$1")" && pwd -P)
    echo "${dir#/}/$(basename "$1")"
    real=$(readlink -f "$1")
    echo "${real#/}"
}
{
    # Merged-/usr top-level symlinks, so the ELF interpreter /lib64/ld-linux-x86-64.so.2 resolves.
    for top in bin sbin lib lib64; do
        [ -L "/$top" ] && echo "$top"
    done
    echo usr/bin/python3
    echo "${py#/}"
    echo etc/passwd
    echo etc/group
    echo etc/ld.so.cache
    echo tmp
    for program in "$@"; do
        add "$program"
    done
    for obj in "$py" $(find "$stdlib/lib-dynload" -name '*.so') "$@"; do
        "$ldso" --list "$obj" 2>/dev/null | awk '{for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i}'
    done | sort -u | while read -r lib; do add "$lib"; done
} | sort -u >"$list"
# The stdlib recursively (without tests), then the listed files and symlinks as they are.
tar -C / -c \
    --exclude="${stdlib#/}/test" --exclude="${stdlib#/}/*/test" --exclude="${stdlib#/}/*/tests" \
    --exclude="${stdlib#/}/idlelib/idle_test" \
    "${stdlib#/}" --no-recursion -T "$list" |
    podman import --quiet - "$image" >/dev/null
echo created
