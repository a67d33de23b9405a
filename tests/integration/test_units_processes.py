"""The unit templates rendered by ansible-playbook (the lookup and the template module) and read back by systemd-
analyze."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import unit_text

from tests.tools import ansible_command, needs
from tests.unit.test_units import (ANALYZE, HOSTILE, RENDER_CASE, RENDER_PLAYBOOK, REPO, TEMPLATES, cases, one,
                                   settings_of, split_exec)


needs_systemd = needs(ANALYZE is None, "systemd-analyze is not installed")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """{case id: (unit text or None, error message, path, helper)} from one ansible-playbook run."""
    work = tmp_path_factory.mktemp("units")
    helper = str(work / "numa-pin")
    with open(helper, "w") as handle:
        handle.write("#!/bin/sh\n")
    os.chmod(helper, 0o755)
    return render_cases(cases(helper), work, helper)


def render_cases(all_cases, work, helper):
    """Render every case with one ansible-playbook run in ``work`` (a pathlib directory)."""
    out = work / "out"
    out.mkdir()
    (work / "render.yml").write_text(RENDER_PLAYBOOK)
    (work / "render_case.yml").write_text(RENDER_CASE)
    (work / "vars.json").write_text(json.dumps({"cases": all_cases, "templates": TEMPLATES, "out": str(out)}),
                                    encoding="utf-8")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", "localhost,", str(work / "render.yml"),
                           "-e", "@" + str(work / "vars.json"), "-e", "ansible_python_interpreter=" + sys.executable],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)
    results_file = out / "results.json"
    assert results_file.exists(), done.stdout
    results = json.loads(results_file.read_text(encoding="utf-8"))
    outcome = {}
    for spec, (text, msg, failed) in zip(all_cases, results):
        path = out / spec["id"]
        if failed:
            text = None
        else:
            path.write_text(text, encoding="utf-8")
        outcome[spec["id"]] = (text, msg, str(path), helper)
    module_path = out / ("module-" + all_cases[0]["id"])
    module_text = module_path.read_text(encoding="utf-8") if module_path.exists() else None
    outcome["module"] = (module_text, "", str(module_path), helper)
    return outcome


def test_lookup_and_template_module_render_the_same(rendered):
    assert rendered["module"][0] == rendered["seed-wrapper"][0]


def text_of(rendered, case_id):
    text, msg, _, _ = rendered[case_id]
    assert text is not None, msg
    return text


def error_of(rendered, case_id):
    text, msg, _, _ = rendered[case_id]
    assert text is None, "rendered although it should fail:\n%s" % text
    return msg


def verify(*paths):
    """systemd-analyze verify; returns its complaints (empty when the units are clean)."""
    done = subprocess.run([ANALYZE, "verify", "--man=no"] + list(paths), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    return done.returncode, done.stdout.strip()


def install(tmp_path, rendered, template_case, dropin_case=None, name="llama"):
    """Lay rendered files out as <name>@.service (+ <name>@1.service.d/50-inferops-numa.conf)."""
    shutil.copy(rendered[template_case][2], str(tmp_path / ("%s@.service" % name)))
    if dropin_case:
        dropins = tmp_path / ("%s@1.service.d" % name)
        dropins.mkdir()
        shutil.copy(rendered[dropin_case][2], str(dropins / "50-inferops-numa.conf"))
    return str(tmp_path / ("%s@1.service" % name))


def test_seed_unit_starts_llama_server_through_numa_pin(rendered):
    unit = text_of(rendered, "seed-wrapper")
    helper = rendered["seed-wrapper"][3]
    argv = split_exec(one(unit, "ExecStart"), instance="1")
    assert argv == [helper, "exec", "--instance", "1",
                    "--model-size", "/srv/models/model.gguf", "--model", "/srv/models/model.gguf",
                    "--instances", "2", "--policy", "bind", "--port-base", "8080", "--",
                    "/opt/llama.cpp/bin/llama-server", "--model", "/srv/models/model.gguf", "--no-mmap",
                    "-t", "{threads}", "--host", "0.0.0.0", "--port", "{port}"]
    assert one(unit, "User") == "llama"
    assert one(unit, "Group") == "llama"
    assert one(unit, "Type") == "exec"
    assert one(unit, "Restart") == "on-failure"
    assert one(unit, "StateDirectory") == "llama"
    assert one(unit, "Environment") == '"LLAMA_ARG_CTX_SIZE=8192"'
    assert "NUMAPolicy" not in dict(settings_of(unit))


def test_replicas_are_asked_for_and_their_directory_is_writable(rendered):
    unit = text_of(rendered, "replicate")
    argv = split_exec(one(unit, "ExecStart"), instance="0")
    flags = argv[:argv.index("--")]
    assert flags[flags.index("--page-cache"):flags.index("--page-cache") + 4] == [
        "--page-cache", "replicate", "--replica-dir", "/srv/replicas"]
    assert [value for key, value in settings_of(unit) if key == "ReadWritePaths"] == ["/srv/cache", "/srv/replicas"]


def test_hostile_arguments_come_back_unchanged(rendered):
    argv = split_exec(one(text_of(rendered, "hostile-wrapper"), "ExecStart"))
    assert argv[argv.index("--") + 1:] == ["/bin/echo"] + HOSTILE


def test_hostile_environment_values_are_quoted(rendered):
    values = [v for k, v in settings_of(text_of(rendered, "hostile-env")) if k == "Environment"]
    # Environment= unquotes and unescapes like ExecStart= but expands specifiers only, never $.
    assert [split_exec(v.replace("$", "$$"))[0] for v in values] == ["A=x y", "B=%i$HOME", 'C=q"\\', "D="]


@pytest.mark.parametrize("case_id, message", [
    ("newline-argv", "argument 1 'line1\\nline2' contains a newline"),
    ("newline-env", "environment variable A 'x\\ny' contains a newline"),
    ("bad-env-name", "'A-B' is not a valid name"),
    ("shell-string", "is not a non-empty list: write the command as a YAML list"),
    ("prefix-executable", "which systemd reads as an ExecStart= prefix"),
    ("bad-extra", "is not a systemd setting name"),
])
def test_unwritable_values_fail_with_the_fix(rendered, case_id, message):
    assert message in error_of(rendered, case_id)


def test_hardening_keeps_the_pinning_syscalls(rendered):
    unit = text_of(rendered, "seed-wrapper")
    values = dict(settings_of(unit))
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "ProtectKernelTunables", "ProtectControlGroups",
                "RestrictSUIDSGID", "LockPersonality"):
        assert values[key] == "yes", key
    assert values["ProtectSystem"] == "strict"
    # These would hide GPU device nodes or break JITs.
    for key in ("PrivateDevices", "ProtectClock", "MemoryDenyWriteExecute", "DevicePolicy", "DeviceAllow"):
        assert key not in values
    filters = [v for k, v in settings_of(unit) if k == "SystemCallFilter"]
    assert filters[0] == "@system-service"
    assert set(filters[1].split()) >= {"sched_setaffinity", "set_mempolicy", "mbind", "move_pages", "get_mempolicy",
                                       "mincore"}  # numa-pin's page-cache look; not in @system-service


@needs_systemd
def test_this_systemd_allows_the_pinning_syscalls_in_system_service_too():
    groups = subprocess.run([ANALYZE, "syscall-filter"], stdout=subprocess.PIPE, universal_newlines=True,
                            check=True).stdout
    members, group = {}, None
    for line in groups.splitlines():
        word = line.strip()
        if line.startswith("@"):
            group = word
            members[group] = set()
        elif word and not word.startswith("#") and group:
            members[group].add(word)

    def expand(name):
        found = set()
        for member in members[name]:
            found |= expand(member) if member.startswith("@") else {member}
        return found
    assert expand("@system-service") >= {"sched_setaffinity", "set_mempolicy", "mbind", "move_pages",
                                         "get_mempolicy", "migrate_pages"}


def test_extras_override_and_escape(rendered):
    unit = text_of(rendered, "extras")
    values = dict(settings_of(unit))
    assert values["LimitMEMLOCK"] == "infinity"
    assert values["Description"] == "100%% llama"
    assert values["WorkingDirectory"] == "/srv"
    assert "NoNewPrivileges" not in values
    assert "ReadWritePaths" not in values  # only with hardening


@needs_systemd
@pytest.mark.parametrize("case_id", ["seed-wrapper", "hostile-wrapper", "hostile-env", "extras", "replicate"])
def test_systemd_accepts_the_wrapper_units(tmp_path, rendered, case_id):
    text_of(rendered, case_id)
    assert verify(install(tmp_path, rendered, case_id)) == (0, "")


def test_systemd_mode_template_has_no_command_of_its_own(rendered):
    unit = text_of(rendered, "systemd-template")
    assert "ExecStart" not in dict(settings_of(unit))
    assert one(unit, "User") == "llama"


def test_systemd_mode_writes_the_plan_as_unit_settings(rendered):
    dropin = text_of(rendered, "systemd-dropin")
    assert one(dropin, "CPUAffinity") == "28-31"
    assert one(dropin, "NUMAPolicy") == "bind"
    assert one(dropin, "NUMAMask") == "1"
    assert one(dropin, "Environment") == '"CUDA_VISIBLE_DEVICES=0"'
    assert split_exec(one(dropin, "ExecStart")) == ["/bin/echo", "-t", "4", "--port", "8081", "28-31", "%n"]


def test_systemd_mode_interleave(rendered):
    dropin = text_of(rendered, "systemd-interleave")
    assert (one(dropin, "NUMAPolicy"), one(dropin, "NUMAMask"), one(dropin, "CPUAffinity")) == (
        "interleave", "0-1", "0-3")


@pytest.mark.parametrize("case_id, message", [
    ("systemd-weighted", "'weighted-interleave' has no systemd NUMAPolicy= equivalent: use pin_mode wrapper"),
    ("systemd-old", "needs systemd >= 243"),
    ("systemd-no-port", "uses {port} but the plan has no port: set port_base"),
])
def test_systemd_mode_refuses_what_systemd_cannot_do(rendered, case_id, message):
    assert message in error_of(rendered, case_id)


def test_a_docker_unit_runs_its_client_through_numa_pin_and_clears_what_a_crash_left(rendered):
    unit = text_of(rendered, "docker-wrapper")
    start = split_exec(one(unit, "ExecStart"), instance="1")
    assert start[1:3] == ["exec", "--instance"] and "--container-runtime" in start
    assert start[start.index("--container-runtime") + 1] == "docker"
    assert start[start.index("--") + 1:start.index("--") + 3] == ["/usr/bin/docker", "run"]
    def commands(setting):
        return [split_exec(value[1:], instance="1") for key, value in settings_of(unit) if key == setting
                and value.startswith("-")]
    assert commands("ExecStartPre") == commands("ExecStopPost") == [["/usr/bin/docker", "rm", "--force", "vllm-1"],
                                                                    ["/bin/rm", "-f", "/run/inferops-numa-vllm-1.cid"]]
    assert commands("ExecStop") == [["/usr/bin/docker", "stop", "--time", "10", "vllm-1"]]
    assert one(unit, "User") == "root" and "NoNewPrivileges" not in dict(settings_of(unit))


def test_systemd_mode_puts_the_plan_after_a_containers_run(rendered):
    dropin = text_of(rendered, "podman-dropin")
    assert split_exec(one(dropin, "ExecStart")) == [
        "/usr/bin/podman", "run", "--cpuset-cpus", "28-31", "--cpuset-mems", "1", "--env", "CUDA_VISIBLE_DEVICES=0",
        "--device", "nvidia.com/gpu=0", "--rm", "--name", "vllm-1", "img", "--port", "8081"]
    assert "ExecStartPre" not in dict(settings_of(text_of(rendered, "podman-dropin")))


def test_systemd_mode_refuses_an_interleaved_docker_container(rendered):
    assert "container runtime docker applies only a cgroup cpuset" in error_of(rendered, "docker-dropin-interleave")


@needs_systemd
@pytest.mark.parametrize("case_id", ["docker-wrapper"])
def test_systemd_accepts_the_container_units(tmp_path, rendered, case_id):
    text_of(rendered, case_id)
    assert verify(install(tmp_path, rendered, case_id)) == (0, "")


@needs_systemd
def test_systemd_accepts_template_plus_placement(tmp_path, rendered):
    text_of(rendered, "systemd-dropin")
    assert verify(install(tmp_path, rendered, "systemd-template", "systemd-dropin")) == (0, "")


@needs_systemd
def test_systemd_refuses_an_instance_without_its_placement(tmp_path, rendered):
    text_of(rendered, "systemd-template")
    code, output = verify(install(tmp_path, rendered, "systemd-template"))
    assert code != 0
    assert "no ExecStart" in output


@needs_systemd
def test_systemd_parses_a_line_of_random_hostile_words(tmp_path):
    words = ["/bin/echo"] + HOSTILE + [chr(c) for c in range(1, 128) if chr(c) not in "\n\r"]
    unit = tmp_path / "hostile.service"
    unit.write_text("[Service]\nExecStart=%s\n" % unit_text.exec_line(words))
    assert verify(str(unit)) == (0, "")
    assert split_exec(unit_text.exec_line(words)) == words


@needs_systemd
def test_systemd_rates_the_hardening(tmp_path, rendered):
    """systemd's own exposure score (0 best .. 10 worst) of the seed unit; 9.6 without any sandboxing."""
    shutil.copy(rendered["seed-wrapper"][2], str(tmp_path / "llama@.service"))
    done = subprocess.run([ANALYZE, "security", "--offline=yes", "--man=no", str(tmp_path / "llama@0.service")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    match = re.search(r"Overall exposure level for llama@0.service: ([0-9.]+)", done.stdout)
    if match is None and "--offline" in done.stdout:
        pytest.skip("this systemd-analyze has no --offline")
    assert match, done.stdout
    assert float(match.group(1)) <= 3.0
