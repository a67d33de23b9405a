"""execution-environment.yml: ansible-builder makes its build context offline (building the image itself needs
podman or docker, which make test does not install)."""

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
    assert "ansible-galaxy collection install" in text and "-r requirements.yml" in text
    assert "openssh-clients" in (context / "_build" / "bindep.txt").read_text()
