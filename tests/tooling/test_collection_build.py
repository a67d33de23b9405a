"""The built collection: what `ansible-galaxy collection build` puts in the tarball, and that it installs and runs.

Only what users run ships - the modules, filters, roles and playbooks with everything they read, the docs,
the alert rules (with their promtool test, for whoever edits them) and the Grafana dashboard,
the license, the changelog and the example inventory the README's quick start copies; none of the
development tooling (tests, lab, molecule, bench, the checkout's ansible.cfg, Makefile, dotfiles) and nothing
that is not in the repository (a venv, caches, build output).
"""

import json
import os
import re
import shutil
import subprocess
import tarfile

import pytest
import yaml

from tests.tools import ansible_command, missing

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED_DIRS = ("plugins/", "roles/", "playbooks/", "docs/", "meta/", "monitoring/", "inventory/example/",
                "inventory/local/")
SHIPPED_FILES = {"README.md", "LICENSE", "CHANGELOG.md", "changelogs/changelog.yaml", "changelogs/config.yaml"}
GENERATED = {"MANIFEST.json", "FILES.json"}
DEV_ONLY = re.compile(r"^(\.|tests/|lab/|molecule/|bench/|build/|changelogs/fragments/|Makefile$|requirements\.txt$|"
                      r"pytest\.ini$|ansible\.cfg$|site\.yml$|execution-environment\.yml$|.*\.tar\.gz$)|"
                      r"(^|/)__pycache__/|\.pyc$")


def _galaxy():
    with open(os.path.join(REPO, "galaxy.yml")) as handle:
        return yaml.safe_load(handle)


def _tracked():
    done = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip("not a git checkout: %s" % done.stderr.strip())
    return {path for path in done.stdout.split("\0") if path and os.path.isfile(os.path.join(REPO, path))}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the tarball's path, its member files) built from this checkout as it is, caches and venv included."""
    out = tmp_path_factory.mktemp("built")
    done = subprocess.run([ansible_command("ansible-galaxy"), "collection", "build", "--output-path", str(out), REPO],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (tarball,) = out.glob("*.tar.gz")
    with tarfile.open(str(tarball)) as archive:
        files = {member.name for member in archive.getmembers() if member.isfile()}
    return tarball, files


def test_the_tarball_holds_what_users_run_and_nothing_else(built):
    tarball, files = built
    galaxy = _galaxy()
    assert tarball.name == "%s-%s-%s.tar.gz" % (galaxy["namespace"], galaxy["name"], galaxy["version"])
    # A stable release: 1.0.0 or later, as numbers (1.10.0 after 1.9.0).
    assert re.fullmatch(r"inferops-numa-\d+\.\d+\.\d+\.tar\.gz", tarball.name)
    assert tuple(int(part) for part in galaxy["version"].split(".")) >= (1, 0, 0)
    tracked = _tracked()
    expected = {path for path in tracked if path.startswith(SHIPPED_DIRS) and not DEV_ONLY.search(path)}
    expected |= SHIPPED_FILES
    assert files - GENERATED == expected
    assert [path for path in files if DEV_ONLY.search(path)] == []
    assert files - GENERATED <= tracked  # nothing from outside the repository (a venv, caches, build output)
    # The maintainers' notes (how the figures were measured, the lab's llama-server build) name the lab and its
    # machine: they live in lab/docs/, kept out with lab/, and the installed docs/ is what users read.
    assert {"lab/docs/benchmarks.md", "lab/docs/llama.md"} <= tracked
    assert [path for path in files if path.startswith("lab/") or path in ("docs/benchmarks.md", "docs/llama.md")] == []


def _read_by(path, text):
    """The files a role's tasks or a playbook name: template and copy sources, file and template lookups,
    included task files; resolved as Ansible resolves them (a role's templates/, files/ and tasks/, or beside
    the playbook)."""
    top = "/".join(path.split("/")[:2]) if path.startswith("roles/") else os.path.dirname(path)
    named = [(source, "templates" if source.endswith(".j2") else "files")
             for source in re.findall(r"^\s*src: ([\w./@-]+)\s*$", text, re.MULTILINE)]
    named += [(source, "files") for source in re.findall(r"lookup\('ansible\.builtin\.file', '([\w./@-]+)'\)", text)]
    named += [(source, "templates")
              for source in re.findall(r"lookup\('ansible\.builtin\.template', '([\w./@-]+)'\)", text)]
    named += [(source, "tasks") for source in re.findall(r"(?:include|import)_tasks: ([\w./-]+\.yml)", text)]
    if path.startswith("roles/"):
        return {"%s/%s/%s" % (top, folder, source) for source, folder in named}
    return {"%s/%s" % (top, source) for source, _ in named}


def test_everything_the_roles_and_playbooks_read_is_inside(built):
    _, files = built
    referenced = set()
    for path in files:
        if path.startswith(("roles/", "playbooks/")) and path.endswith((".yml", ".j2")):
            with open(os.path.join(REPO, path)) as handle:
                referenced |= _read_by(path, handle.read())
    for expected in ("roles/numa_host/files/installed_stamp.py", "roles/inference_service/templates/service@.service.j2",
                     "roles/inference_service/tasks/service.yml"):
        assert expected in referenced, expected
    assert referenced <= files, sorted(referenced - files)
    # The numa_report action renders the report pages from the collection's templates (plugin_utils/report_pages.py).
    pages = {"playbooks/templates/%s_report.%s.j2" % (kind, fmt) for kind in ("fleet", "cost") for fmt in ("md", "html")}
    assert pages <= files, sorted(pages - files)
    # numa_host installs the helper from the collection's own package, beside the roles.
    assert "plugins/module_utils/numa/__main__.py" in files and "plugins/module_utils/numa/cli/numa_pin.py" in files


def test_license_and_metadata_match_and_name_no_placeholder(built):
    _, files = built
    galaxy = _galaxy()
    assert galaxy["license"] == ["GPL-3.0-or-later"] and "LICENSE" in files
    with open(os.path.join(REPO, "LICENSE")) as handle:
        text = handle.read()
    assert text.startswith(" " * 20 + "GNU GENERAL PUBLIC LICENSE\n" + " " * 23 + "Version 3, 29 June 2007")
    assert "END OF TERMS AND CONDITIONS" in text and len(text) > 30000
    for key in ("repository", "documentation", "homepage", "issues"):
        value = galaxy.get(key)
        assert value is None or not re.search(r"example|invalid|localhost|changeme|todo", value, re.I), key
    for plugin in (path for path in files if path.startswith("plugins/") and path.endswith(".py")
                   and "/module_utils/" not in path):
        with open(os.path.join(REPO, plugin)) as handle:
            assert "GNU General Public License v3.0+" in handle.read(), plugin


def test_the_installed_tarball_runs_its_playbooks_and_documents_itself(built, tmp_path):
    tarball, _ = built
    collections = tmp_path / "collections"
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_NOCOLOR="1", HOME=str(tmp_path))
    done = subprocess.run([ansible_command("ansible-galaxy"), "collection", "install", str(tarball), "-p",
                           str(collections)], cwd=str(tmp_path), env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    installed = collections / "ansible_collections" / "inferops" / "numa"
    inventory = installed / "inventory" / "example"
    for playbook in ("inferops.numa.site", "inferops.numa.cost_report"):
        done = subprocess.run([ansible_command("ansible-playbook"), "-i", str(inventory), "--syntax-check", playbook],
                              cwd=str(tmp_path), env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run([ansible_command("ansible-doc"), "-t", "role", "--json", "inferops.numa.inference_service",
                           "inferops.numa.numa_host"], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    roles = json.loads(done.stdout)
    entry = roles["inferops.numa.inference_service"]["entry_points"]["main"]["options"]["inference_service_list"]
    assert entry["options"]["layout"]["default"] == "single"
    with open(str(installed / "MANIFEST.json")) as handle:
        assert json.load(handle)["collection_info"]["license"] == ["GPL-3.0-or-later"]


def test_the_changelog_is_what_antsibull_changelog_makes_of_its_fragments(tmp_path):
    """CHANGELOG.md is generated: a change is a fragment in changelogs/fragments/, released into changelog.yaml."""
    # Beside this core's ansible, else the project's venv (a matrix venv holds only ansible-core and the test tools;
    # the changelog does not depend on the core).
    places = (os.path.dirname(ansible_command("ansible")), os.path.join(REPO, ".venv", "bin"))
    tool = next((path for path in (os.path.join(place, "antsibull-changelog") for place in places)
                 if os.access(path, os.X_OK)), None)
    if tool is None:
        missing("antsibull-changelog is not installed beside this interpreter nor in .venv: "
                "pip install -r requirements.txt")
    for name in ("galaxy.yml", "CHANGELOG.md"):
        shutil.copy(os.path.join(REPO, name), str(tmp_path))
    shutil.copytree(os.path.join(REPO, "changelogs"), str(tmp_path / "changelogs"))
    for argv in ([tool, "lint"], [tool, "generate"]):
        done = subprocess.run(argv, cwd=str(tmp_path), capture_output=True, text=True, check=False)
        assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
    with open(os.path.join(REPO, "CHANGELOG.md")) as handle:
        assert (tmp_path / "CHANGELOG.md").read_text() == handle.read()
    with open(os.path.join(REPO, "changelogs", "changelog.yaml")) as handle:
        assert _galaxy()["version"] in yaml.safe_load(handle)["releases"]
