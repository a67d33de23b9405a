"""lab/container.py, the container scenario's host (molecule/container): its image's tag follows its recipe, each
checkout names its own container, and the snapshot comparison names every change and only those asked for.
(The container itself is started and checked by the scenario: `make molecule-container`.)"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "lab"))
import container  # noqa: E402  (lab/ is not a package)


def test_the_image_is_made_again_when_its_recipe_changes(monkeypatch):
    before = container.image_name()
    assert before == container.image_name() and before.startswith(container.REPOSITORY + ":")
    monkeypatch.setattr(container, "PACKAGES", container.PACKAGES + ["less"])
    assert container.image_name() != before


def test_each_checkout_names_its_own_container(tmp_path):
    one, other = tmp_path / "one", tmp_path / "other"
    assert container.container_name("container", str(one)) != container.container_name("container", str(other))
    assert container.container_name("container", str(one)).startswith("molecule-container-")


def _snapshot(**changes):
    taken = {"files": {"/etc/passwd": "100644 0:0 aa", "/etc/x": "100644 0:0 bb"}, "users": ["root"],
             "groups": ["root"], "units": {"ssh.service": "active running"}, "unit_files": {"ssh.service": "enabled"},
             "knobs": {"/proc/sys/kernel/numa_balancing": "0"}}
    for kind, value in changes.items():
        taken[kind] = dict(taken[kind], **value) if isinstance(value, dict) else value
    return taken


def test_no_change_is_no_difference():
    assert container.differences(_snapshot(), _snapshot()) == []


def test_every_kind_of_change_is_named_one_line_each():
    after = _snapshot(files={"/etc/passwd": "100644 0:0 cc", "/etc/inferops-numa/a.json": "100644 0:0 dd"},
                      users=["root", "standin"], units={"standin@0.service": "active running"},
                      knobs={"/proc/sys/kernel/numa_balancing": "1"})
    del after["unit_files"]["ssh.service"]
    assert container.differences(_snapshot(), after) == [
        "+ files /etc/inferops-numa/a.json", "~ files /etc/passwd: 100644 0:0 aa -> 100644 0:0 cc",
        "+ users standin", "+ units standin@0.service", "- unit_files ssh.service",
        "~ knobs /proc/sys/kernel/numa_balancing: 0 -> 1"]


def test_only_the_prefixes_asked_for_are_left_out():
    after = _snapshot(files={"/opt/standin/x.py": "100644 0:0 ee", "/opt/standin-other": "100644 0:0 ff"})
    assert container.differences(_snapshot(), after, ["/opt/standin/"]) == ["+ files /opt/standin-other"]
