#!/usr/bin/env bash
# Fills a wheelhouse with every wheel the FunctionBench functions' requirements need, for the
# runtime Hearth's sandboxes use (Debian bookworm's python3 3.11, cp311, glibc 2.36, x86_64), so
# that dependency layers and tests install with `pip install --no-index --find-links DIR` and never
# reach the network. This is the one place that talks to PyPI: setup runs it, tests only read DIR.
#
# Usage: scripts/wheelhouse.sh [DIR]        (default /var/cache/hearth/wheelhouse)
# Environment: PYTHON (the pip to use, default python3: the host's 3.11, not the runtime's).
#
# Idempotent: DIR/.hearth-wheelhouse holds a hash of every requirements file (and of this
# script's target platform); when it matches, nothing is downloaded. Every requirement must be
# pinned (`name==version`) and every transitive dependency listed: each is fetched with
# --no-deps, then each requirements file is resolved against DIR alone (offline) to prove it is
# complete. A package that ships only an sdist is built here with `pip wheel`, and must come out
# pure Python (`py3-none-any`): nothing is compiled for the runtime on the host.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/var/cache/hearth/wheelhouse}
PY=${PYTHON:-python3}
PLATFORM=(--python-version 3.11 --implementation cp --abi cp311
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux_2_28_x86_64 --only-binary=:all:)

shopt -s nullglob
reqs=(functions/functionbench/*/requirements.txt)
[ ${#reqs[@]} -gt 0 ] || { echo "wheelhouse: no requirements files found" >&2; exit 1; }

hash=$({
    printf '%s\n' "${PLATFORM[*]}"
    for f in "${reqs[@]}"; do printf '%s\n' "$f"; cat "$f"; done
} | sha256sum | cut -d' ' -f1)
marker="$DIR/.hearth-wheelhouse"

size() {
    local w=("$DIR"/*.whl)
    echo "wheelhouse: $DIR: ${#w[@]} wheels, $(du -sh "$DIR" | cut -f1) in all"
}

if [ -f "$marker" ] && [ "$(cat "$marker")" = "$hash" ]; then
    echo "wheelhouse: up to date"
    size
    exit 0
fi
mkdir -p "$DIR"
rm -f "$marker"

# Every distinct requirement line, comments and blanks dropped; each must be an exact pin.
mapfile -t lines < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "${reqs[@]}" | grep -v '^$' | sort -u)
for r in "${lines[@]}"; do
    if ! [[ $r =~ ^[A-Za-z0-9._-]+==[A-Za-z0-9.]+$ ]]; then
        echo "wheelhouse: '$r' is not pinned as name==version" >&2
        exit 1
    fi
done

build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
for r in "${lines[@]}"; do
    if "$PY" -m pip download -q --disable-pip-version-check --no-deps "${PLATFORM[@]}" \
        -d "$DIR" "$r" 2>"$build/err"; then
        continue
    fi
    # No wheel for the runtime: only a pure-Python sdist may be built here.
    echo "wheelhouse: $r has no cp311 manylinux wheel; building it from its sdist"
    rm -rf "$build/w" && mkdir -p "$build/w"
    "$PY" -m pip wheel -q --disable-pip-version-check --no-deps --no-binary=:all: \
        -w "$build/w" "$r" || { cat "$build/err" >&2; exit 1; }
    for w in "$build/w"/*.whl; do
        case "$w" in
        *-py3-none-any.whl | *-py2.py3-none-any.whl) cp "$w" "$DIR/" ;;
        *)
            echo "wheelhouse: $r built as $(basename "$w"), not pure Python; refusing it" >&2
            exit 1
            ;;
        esac
    done
done

# Offline proof that each function's requirements resolve from DIR alone, for the runtime.
for f in "${reqs[@]}"; do
    if ! "$PY" -m pip install -q --disable-pip-version-check --dry-run --ignore-installed \
        --no-index --find-links "$DIR" "${PLATFORM[@]}" --target "$build/t" -r "$f"; then
        echo "wheelhouse: $f does not resolve from $DIR alone (an unpinned dependency?)" >&2
        exit 1
    fi
done

echo "$hash" >"$marker"
size
