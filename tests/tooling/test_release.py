"""The release: galaxy.yml is the one place that names the collection's version, and the changelog names what the
collection has.

Everything else that names the version either reads galaxy.yml (lab/ee.py, the tests) or is held to it here
(execution-environment.yml's tarball, the README's quick start; numa-pin ``--version`` in
tests/integration/test_cli_processes.py). tests/tooling/test_collection_build.py holds CHANGELOG.md to what
antsibull-changelog makes of changelogs/ and the tarball's name to galaxy.yml.
"""

import glob
import os
import re
import subprocess

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARBALL = re.compile(r"inferops-numa-(\d+\.\d+\.\d+\S*?)\.tar\.gz")
VERSION_ADDED = re.compile(r"^\s*version_added:\s*['\"]?([^'\"\s#]+)", re.MULTILINE)
# The changelog's own history names the versions it released; those are not "the version".
HISTORY = ("changelogs/", "CHANGELOG.md")


def _load(path):
    with open(os.path.join(REPO, path)) as handle:
        return yaml.safe_load(handle)


def _version():
    return _load("galaxy.yml")["version"]


def _key(version):
    """1.10.0 after 1.9.0: numbers compared as numbers (a pre-release suffix is not used by this collection)."""
    return tuple(int(part) for part in version.split("."))


def _tracked():
    done = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip("not a git checkout: %s" % done.stderr.strip())
    return [path for path in done.stdout.split("\0") if path and os.path.isfile(os.path.join(REPO, path))]


def _text(path):
    try:
        with open(os.path.join(REPO, path), encoding="utf-8") as handle:
            return handle.read()
    except UnicodeDecodeError:
        return ""


def test_every_tarball_name_outside_the_history_is_galaxys_version():
    version = _version()
    named = {}
    for path in _tracked():
        if path.startswith(HISTORY) or path == "LICENSE":
            continue
        for found in TARBALL.findall(_text(path)):
            named.setdefault(path, set()).add(found)
    # The two that cannot read galaxy.yml: ansible-builder's static definition and the README's command.
    assert {"execution-environment.yml", "README.md"} <= set(named), sorted(named)
    wrong = {path: sorted(found) for path, found in named.items() if found != {version}}
    assert wrong == {}, "galaxy.yml says %s" % version


def _documented():
    """{path: [version_added values]} of every plugin doc and role argument spec."""
    paths = glob.glob(os.path.join(REPO, "plugins", "**", "*.py"), recursive=True)
    paths += glob.glob(os.path.join(REPO, "plugins", "**", "*.yml"), recursive=True)
    paths += glob.glob(os.path.join(REPO, "roles", "*", "meta", "argument_specs.yml"))
    found = {}
    for path in paths:
        with open(path) as handle:
            values = VERSION_ADDED.findall(handle.read())
        if values:
            found[os.path.relpath(path, REPO)] = values
    return found


def test_no_version_added_is_later_than_galaxys_or_a_version_never_released():
    """ansible-doc's "added in X" must be a release users could have had: this one or one in changelog.yaml.
    (0.2.0 and 0.4.0 were never released; what was added after 0.1.0 is new in 1.0.0.)"""
    version = _version()
    released = set(_load("changelogs/changelog.yaml")["releases"]) | {version}
    documented = _documented()
    assert "plugins/modules/numa_weights.py" in documented and "plugins/filter/systemd_path.yml" in documented
    later = {path: values for path, values in documented.items()
             if any(_key(value) > _key(version) for value in values)}
    assert later == {}, "galaxy.yml says %s" % version
    unreleased = {path: values for path, values in documented.items() if set(values) - released}
    assert unreleased == {}, "released: %s" % sorted(released)


def _plugins():
    """{type: names} of what the collection has: modules and callbacks by file, filters by their doc files (every
    filter has one: tests/unit/test_doc_fragments.py)."""
    def names(folder, pattern):
        return {os.path.splitext(os.path.basename(path))[0]
                for path in glob.glob(os.path.join(REPO, "plugins", folder, pattern))
                if not os.path.basename(path).startswith("_")}
    filters = {_load(os.path.relpath(path, REPO))["DOCUMENTATION"]["name"]
               for path in glob.glob(os.path.join(REPO, "plugins", "filter", "*.yml"))}
    return {"module": names("modules", "*.py"), "callback": names("callback", "*.py"), "filter": filters}


def _released_names():
    """{type: {name: version}} of every plugin and module changelog.yaml says a release added."""
    named = {}
    for version, release in _load("changelogs/changelog.yaml")["releases"].items():
        for entry in release.get("modules", []):
            named.setdefault("module", {})[entry["name"]] = version
        for kind, entries in release.get("plugins", {}).items():
            for entry in entries:
                named.setdefault(kind, {})[entry["name"]] = version
    return named


def _said_gone(name):
    """A later release says the plugin was renamed or removed (breaking_changes or removed_features name it)."""
    for release in _load("changelogs/changelog.yaml")["releases"].values():
        changes = release.get("changes", {})
        for section in ("breaking_changes", "removed_features"):
            if any("``%s``" % name in text for text in changes.get(section, [])):
                return True
    return False


def test_the_changelog_names_every_plugin_the_collection_has_and_none_it_lacks():
    have, released = _plugins(), _released_names()
    assert "numa_weights" in have["module"] and "untouched_hosts" in have["callback"]
    for kind, names in have.items():
        missing = names - set(released.get(kind, {}))
        assert missing == set(), "%s the changelog never released (version_added, then release): %s" % (kind, missing)
    for kind, names in released.items():
        gone = {name for name in names if name not in have.get(kind, set()) and not _said_gone(name)}
        assert gone == set(), "the changelog lists %s %s the collection no longer has, and says nowhere" % (kind, gone)


def test_the_plugin_cache_antsibull_changelog_releases_from_is_the_collection():
    """antsibull-changelog lists a release's new plugins from changelogs/.plugin-cache.yaml, regenerated only when
    the version changes: a stale cache would release names that no longer exist (numa_substitute did)."""
    cache = _load("changelogs/.plugin-cache.yaml")
    assert cache["version"] == _version()
    have = _plugins()
    cached = {kind: set(cache["plugins"].get(kind) or {}) for kind in have}
    assert cached == have
