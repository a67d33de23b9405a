"""execution-environment.yml: ansible-builder makes its build context offline; lab/ee.py's test definition is the
shipped one on a local Debian base. (The image is built with podman and used by the lab: molecule/default/tests/
test_ee.py.)"""

import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml

from tests.tools import missing

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tool(name):
    beside = os.path.join(os.path.dirname(sys.executable), name)
    found = beside if os.access(beside, os.X_OK) else shutil.which(name)
    if found is None:
        missing("%s is not installed: pip install -r requirements.txt" % name)
    return found


def _galaxy():
    with open(os.path.join(REPO, "galaxy.yml")) as handle:
        return yaml.safe_load(handle)


def test_ansible_builder_creates_the_context_with_the_collection_and_the_pinned_core(tmp_path):
    builder, galaxy_cli = _tool("ansible-builder"), _tool("ansible-galaxy")
    with open(os.path.join(REPO, "execution-environment.yml")) as handle:
        definition = yaml.safe_load(handle)
    (source,) = [entry["src"] for entry in definition["additional_build_files"]]
    tarball = "%s-%s-%s.tar.gz" % (_galaxy()["namespace"], _galaxy()["name"], _galaxy()["version"])
    assert os.path.basename(source) == tarball
    # As its comment says: the tarball first, where the definition takes it from.
    shutil.copy(os.path.join(REPO, "execution-environment.yml"), str(tmp_path))
    built = subprocess.run([galaxy_cli, "collection", "build", "--output-path",
                            str(tmp_path / os.path.dirname(source)), REPO],
                           capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    context = tmp_path / "context"
    created = subprocess.run([builder, "create", "-f", str(tmp_path / "execution-environment.yml"), "--context",
                              str(context)], cwd=str(tmp_path), capture_output=True, text=True, check=False,
                             env=dict(os.environ, HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9"))
    assert created.returncode == 0, created.stdout + created.stderr
    shipped = context / "_build" / "collections" / tarball
    with tarfile.open(str(shipped)) as archive:
        assert "MANIFEST.json" in archive.getnames() and "roles/inference_service/tasks/main.yml" in archive.getnames()
    with open(str(context / "_build" / "requirements.yml")) as handle:
        assert yaml.safe_load(handle)["collections"] == [{"name": "collections/" + tarball, "type": "file"}]
    (instructions,) = [path for path in (context / "Containerfile", context / "Dockerfile") if path.exists()]
    text = instructions.read_text()
    with open(os.path.join(REPO, "requirements.txt")) as handle:
        core_pin = re.search(r"^ansible-core==\S+", handle.read(), re.MULTILINE).group(0)
    assert 'ANSIBLE_INSTALL_REFS="%s ansible-runner==' % core_pin in text
    # ansible-core's cryptography is make test's (requirements.txt): an unpinned one prints deprecation warnings.
    with open(os.path.join(REPO, "requirements.txt")) as handle:
        crypto_pin = re.search(r"^cryptography==\S+", handle.read(), re.MULTILINE).group(0)
    assert definition["dependencies"]["python"] == [crypto_pin]
    assert (context / "_build" / "requirements.txt").read_text().split() == [crypto_pin]
    # The collection compiled in the final image, after it is copied there and while the build is still root.
    final = text[text.index("FROM base AS final"):]
    assert final.index("COPY --from=galaxy") < final.index("compileall") < final.index("USER 1000")
    assert "ansible-galaxy collection install" in text and "-r requirements.yml" in text
    assert "openssh-clients" in (context / "_build" / "bindep.txt").read_text()


def _ee():
    sys.path.insert(0, os.path.join(REPO, "lab"))
    import ee
    return ee


def test_the_labs_definition_is_the_shipped_one_on_the_debian_base(tmp_path):
    ee = _ee()
    with open(os.path.join(REPO, "execution-environment.yml")) as handle:
        shipped = yaml.safe_load(handle)
    tarball = tmp_path / os.path.basename(shipped["additional_build_files"][0]["src"])
    ours = ee.lab_definition(shipped, "localhost/base:1", tarball)
    assert ours["images"] == {"base_image": {"name": "localhost/base:1"}}
    assert ours["dependencies"]["python_interpreter"] == {"package_system": "python3", "python_path": "/usr/bin/python3"}
    assert ours["options"]["package_manager_path"] == "/usr/bin/apt-get"
    assert ours["additional_build_files"][0] == dict(shipped["additional_build_files"][0], src=str(tarball))
    assert ours["version"] == shipped["version"]
    assert dict(ours["dependencies"], python_interpreter=None) == dict(shipped["dependencies"], python_interpreter=None)
    assert shipped["images"]["base_image"]["name"].startswith("registry.")  # the shipped one is unchanged


def test_the_shipped_base_image_is_pinned_by_digest():
    """A tag (ubi:latest) moves under a rebuild; only a digest makes the image that was tested the one users build."""
    with open(os.path.join(REPO, "execution-environment.yml")) as handle:
        name = yaml.safe_load(handle)["images"]["base_image"]["name"]
    assert re.fullmatch(r"registry\.access\.redhat\.com/ubi9/ubi(?::[\w.-]+)?@sha256:[0-9a-f]{64}", name), name


def test_the_base_is_made_again_when_its_recipe_changes(monkeypatch):
    ee = _ee()
    before = ee.base_name()
    assert before == ee.base_name() and before.startswith(ee.BASE_REPOSITORY + ":")
    monkeypatch.setattr(ee, "BASE_PACKAGES", ee.BASE_PACKAGES + ["less"])
    assert ee.base_name() != before
