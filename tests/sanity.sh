#!/usr/bin/env bash
# ansible-test sanity on a copy of the collection, offline.
#
# ansible-test must run from .../ansible_collections/<ns>/<name>/ and, for its
# virtualenvs, bootstraps pip with a script it would download; a stand-in that
# uses the interpreter's own ensurepip + pip (PyPI is reachable) replaces it.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="$repo/.venv/bin"
mkdir -p "$repo/build"
scratch="$(mktemp -d "$repo/build/sanity.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
work="$scratch/ansible_collections/inferops/numa"
python_version="${SANITY_PYTHON:-3.11}"

mkdir -p "$work"
# Only what ships in the collection; lab/, bench/, molecule/ and the tests are
# development tooling that galaxy.yml leaves out of the build as well.
git -C "$repo" ls-files -z --cached --others --exclude-standard -- \
    galaxy.yml meta plugins roles playbooks README.md docs tests/config.yml tests/sanity \
  | (cd "$repo" && tar --null -T - -cf -) | tar -xf - -C "$work"

pip_versions=$(grep -ho "pip='[0-9.]*'" "$("$bin/python" -c 'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')/_internal/python_requirements.py" | tr -d "pip='")
cache="$HOME/.ansible/test/cache"
mkdir -p "$cache"
for version in $pip_versions; do
  stand_in="$cache/get_pip_${version//./_}.py"
  [ -f "$stand_in" ] || cat > "$stand_in" <<'PY'
"""Offline stand-in for get-pip.py: ensurepip, then pip install the pinned packages."""
import subprocess
import sys

args = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"])
subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
PY
done

# The copy sits inside this (git-ignored) build/ folder: give it a repository of
# its own, or ansible-test sees every file as ignored and skips them all.
cd "$work"
printf '/tests/output/\n' > .gitignore
git init -q . && git add -A
"$bin/ansible-test" sanity --venv --python "$python_version" --color no "$@"
