#!/usr/bin/env python3
"""The collection's execution environment (EE), built with podman as AWX runs it, on a local Debian base.

    lab/ee.py base       make (once) the Debian base image, print its name
    lab/ee.py build      build the EE from execution-environment.yml on that base, print its name and how long
                         each step took
    lab/ee.py name       print the EE's name (nothing built)
    lab/ee.py env        print the environment podman needs here, as NAME=VALUE lines

The shipped execution-environment.yml builds on a public base (UBI) for users. The public bases cannot be
pulled here, so the tests build the same definition on a Debian rootfs made offline by mmdebstrap and
imported into podman (cached by its recipe's hash, like the lab's guest image); only the base image, its
Python and its package manager differ, everything else (ansible-core, ansible-runner, the collection from
its tarball, the system packages) is the shipped definition's.

podman needs two settings in this sandbox (containers_conf()): the runc runtime (crun refuses the hybrid
cgroup layout) and no default ulimits (setting RLIMIT_NOFILE is not permitted). Builds use the host's
network: no CNI plugins or slirp are installed. Python stdlib plus PyYAML (the venv's); root (mmdebstrap
--mode=root, rootful podman).
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import yaml

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "build" / "ee"

# --- the base image's recipe: every constant here feeds its tag -------------------------------------------
BASE_RECIPE_VERSION = 1
SUITE = "bookworm"
# python3-pip: ansible-builder pip-installs ansible-core and ansible-runner; python3-venv: the ensurepip module the
# second hook answers; openssh-client: the EE's ssh (the shipped definition's openssh-clients is an rpm name,
# skipped on dpkg).
BASE_PACKAGES = ["python3", "python3-pip", "python3-venv", "openssh-client", "ca-certificates"]
# The host's local certificate authorities (a TLS-inspecting proxy's, a company's): the EE's pip and ansible-galaxy
# reach their registries through the host's network, so the base trusts what the host trusts.
LOCAL_CAS = "/usr/local/share/ca-certificates"
BASE_HOOKS = [
    "for ca in %s/*.crt; do if [ -f \"$ca\" ]; then cp \"$ca\" \"$1\"%s/; fi; done; "
    "chroot \"$1\" update-ca-certificates >/dev/null" % (LOCAL_CAS, LOCAL_CAS),
    # ansible-builder's pip_install runs `python3 -m ensurepip --root /` first, which Debian disables for its
    # system Python: the base answers it with the pip python3-pip installed.
    "for main in \"$1\"/usr/lib/python3.*/ensurepip/__main__.py; do "
    "printf 'import pip  # Debian: pip is python3-pip\\n' > \"$main\"; done",
]
MIRROR = "http://deb.debian.org/debian"
BASE_REPOSITORY = "localhost/inferops-numa-debian"
EE_NAME = "localhost/inferops-numa-ee:test"
# What the Debian base changes in the shipped definition: its Python and its package manager.
DEBIAN_PYTHON = {"package_system": "python3", "python_path": "/usr/bin/python3"}
DEBIAN_PACKAGE_MANAGER = "/usr/bin/apt-get"


class EEError(Exception):
    """A build step that cannot run, with the cause and the fix."""


def base_recipe() -> Dict[str, object]:
    return {"version": BASE_RECIPE_VERSION, "suite": SUITE, "variant": "minbase",
            "packages": sorted(BASE_PACKAGES), "hooks": BASE_HOOKS, "mirror": MIRROR, "local_cas": _local_cas()}


def _local_cas() -> Dict[str, str]:
    """{file name: its sha256} of the host's local certificate authorities, which the base copies."""
    found = {}
    for path in sorted(Path(LOCAL_CAS).glob("*.crt")):
        found[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def base_name() -> str:
    blob = json.dumps(base_recipe(), sort_keys=True).encode()
    return "%s:%s" % (BASE_REPOSITORY, hashlib.sha256(blob).hexdigest()[:16])


def containers_conf() -> Path:
    """The containers.conf podman reads here (CONTAINERS_CONF), written once."""
    path = WORK / "containers.conf"
    text = ('# Written by lab/ee.py: the settings podman needs in this sandbox.\n'
            '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n')
    if not path.is_file() or path.read_text() != text:
        WORK.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def podman_environment(base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """``base`` (os.environ) with CONTAINERS_CONF set: every podman run here, the builder's and the runner's too."""
    return dict(os.environ if base is None else base, CONTAINERS_CONF=str(containers_conf()))


def _run(argv: List[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, check=True, env=podman_environment(), **kwargs)
    except FileNotFoundError:
        raise EEError("%s: %s is not installed; make apt installs podman, runc and mmdebstrap, make venv "
                      "ansible-galaxy and ansible-builder (run ee.py with the venv's python)" % (what, argv[0]))
    except subprocess.CalledProcessError as exc:
        raise EEError("%s failed (exit %d); see the output above" % (what, exc.returncode))


def _venv_tool(name: str) -> str:
    """A tool of the venv this script runs in (ansible-galaxy, ansible-builder)."""
    return str(Path(sys.executable).parent / name)


def image_exists(name: str) -> bool:
    try:
        return subprocess.run(["podman", "image", "exists", name], env=podman_environment(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    except FileNotFoundError:
        raise EEError("podman is not installed; run make apt (Debian: apt-get install podman runc)")


def ensure_base(log=sys.stderr) -> str:
    """The Debian base image of the current recipe, made if podman does not have it."""
    return debian_image(base_name(), BASE_PACKAGES, BASE_HOOKS, "the EE's Debian %s base" % SUITE, "/bin/bash", log)


def debian_image(name: str, packages: List[str], hooks: List[str], what: str, command: str, log=sys.stderr) -> str:
    """The podman image ``name``, made if podman does not have it: a Debian minbase rootfs with ``packages``, each
    of ``hooks`` run on it (mmdebstrap's customize hooks, "$1" the rootfs), imported with ``command`` as its CMD.
    The EE's base and the container scenario's image (lab/container.py) are both made here."""
    if image_exists(name):
        return name
    if os.geteuid() != 0:
        raise EEError("making %s needs root (mmdebstrap --mode=root, rootful podman); rerun as root" % what)
    WORK.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="base-", dir=str(WORK)) as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        started = time.monotonic()
        customize = ["--customize-hook=" + hook for hook in hooks]
        _run(["mmdebstrap", "--mode=root", "--variant=minbase", "--include=" + ",".join(packages),
              "--aptopt=Acquire::Languages \"none\""] + customize + [SUITE, str(tarball), MIRROR],
             "mmdebstrap (%s)" % what, stdout=log, stderr=log)
        _run(["podman", "import", "--change", "CMD [%s]" % json.dumps(command), str(tarball), name], "podman import",
             stdout=log, stderr=log)
        print("ee: made %s, %s, in %.0f s" % (what, name, time.monotonic() - started), file=log)
    return name


def lab_definition(shipped: Dict[str, object], base: str, tarball: Path) -> Dict[str, object]:
    """The shipped definition on the Debian ``base``: its Python and package manager Debian's, its collection
    tarball taken from ``tarball``; everything else as shipped."""
    definition = json.loads(json.dumps(shipped))
    definition["images"] = {"base_image": {"name": base}}
    definition["dependencies"]["python_interpreter"] = dict(DEBIAN_PYTHON)
    definition.setdefault("options", {})["package_manager_path"] = DEBIAN_PACKAGE_MANAGER
    for entry in definition.get("additional_build_files", []):
        if os.path.basename(entry["src"]) == tarball.name:
            entry["src"] = str(tarball)
    return definition


def collection_tarball(log) -> Path:
    with open(str(REPO / "galaxy.yml")) as handle:
        galaxy = yaml.safe_load(handle)
    out = WORK / "collection"
    shutil.rmtree(str(out), ignore_errors=True)
    out.mkdir(parents=True)
    _run([_venv_tool("ansible-galaxy"), "collection", "build", "--output-path", str(out),
          str(REPO)], "ansible-galaxy collection build", stdout=log, stderr=log)
    return out / ("%s-%s-%s.tar.gz" % (galaxy["namespace"], galaxy["name"], galaxy["version"]))


def build(log=sys.stderr) -> Dict[str, object]:
    """Build the EE (EE_NAME); returns its name and the seconds of each step."""
    seconds = {}  # type: Dict[str, float]
    started = time.monotonic()
    base = ensure_base(log)
    seconds["base"] = time.monotonic() - started
    with open(str(REPO / "execution-environment.yml")) as handle:
        shipped = yaml.safe_load(handle)
    step = time.monotonic()
    tarball = collection_tarball(log)
    definition_file = WORK / "execution-environment.yml"
    definition_file.write_text(yaml.safe_dump(lab_definition(shipped, base, tarball), sort_keys=False))
    _run([_venv_tool("ansible-builder"), "build", "-f", str(definition_file),
          "-c", str(WORK / "context"), "-t", EE_NAME, "--container-runtime", "podman",
          "--extra-build-cli-args", "--network host", "-v", "2"],
         "ansible-builder build", stdout=log, stderr=log, cwd=str(WORK))
    seconds["ee"] = time.monotonic() - step
    return {"name": EE_NAME, "base": base, "seconds": {key: round(value, 1) for key, value in seconds.items()}}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="ee.py", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("base", "build", "name", "env"))
    args = parser.parse_args(argv)
    try:
        if args.command == "base":
            print(ensure_base())
        elif args.command == "build":
            print(json.dumps(build()))
        elif args.command == "name":
            print(EE_NAME)
        else:
            print("CONTAINERS_CONF=%s" % containers_conf())
    except EEError as exc:
        print("ee: %s" % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
