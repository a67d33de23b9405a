"""The inference_service unit templates, rendered by Ansible itself, read back like systemd reads them.

Templates are rendered once per session by a real ``ansible-playbook`` run of
``ansible.builtin.template`` (the role's own templates and filters, Ansible's
own Jinja settings). Each rendered unit is then:

- split back into argv with an independent reading of systemd's rules
  (specifiers, quotes, C escapes, ``$$``) and compared with the argv we meant;
- checked by ``systemd-analyze verify`` (and its syscall-filter groups) where
  systemd is installed.
"""

import json
import os
import pathlib
import re
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import unit_text
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.tokens import substitute_tokens


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATES = os.path.join(REPO, "roles", "inference_service", "templates")
ANALYZE = shutil.which("systemd-analyze")

HOSTILE = [
    "plain", "two words", "", "100%", "%i", "%n%%", "$HOME", "${PATH}", "$$", "a\"quote", "it's",
    "back\\slash", "trailing\\", ";", "\\;", "x;y", "tab\there", "bell\x07", "{\"json\": [1, 2]}",
    "-t", "{threads}", "--port={port}", "unicode ✓ é", "#not-a-comment", "@at", "-dash", "\\x41",
]

SEED_SERVICE = {
    "name": "llama", "layout": "per_node", "pin_mode": "wrapper", "user": "llama", "group": None,
    "command": ["/opt/llama.cpp/bin/llama-server", "--model", "/srv/models/model.gguf", "--no-mmap",
                "-t", "{threads}", "--host", "0.0.0.0", "--port", "{port}"],
    "environment": {"LLAMA_ARG_CTX_SIZE": "8192"}, "description": None, "type": "exec", "restart": "on-failure",
    "restart_sec": 5, "working_directory": None, "state_directory": True, "read_write_paths": [],
    "hardening": True, "extra_settings": {}, "replica_dir": None, "container": None,
}
SEED_REQUEST = {"node": None, "gpus": None, "model_size": "/srv/models/model.gguf", "model": "/srv/models/model.gguf",
                "memory_headroom": None, "smt": None, "reserve_cpus": None, "scope": None, "instances": 2,
                "policy": "bind", "on_unfit": None, "page_cache": None, "replica_dir": None, "port_base": 8080,
                "container_runtime": None}
PLAN_NODE1 = {"policy": "bind", "mem_nodes": [1], "cpu_nodes": [1], "node": 1, "cpus": [28, 29, 30, 31],
              "cpulist": "28-31", "threads": 4, "gpus": ["0000:81:00.0"], "env": {"CUDA_VISIBLE_DEVICES": "0"},
              "instance": 1, "instances": 2, "port": 8081, "required_bytes": 1, "available_bytes": 7,
              "reasons": ["free memory moves"], "inputs": {}}


# --- reading a unit back the way systemd does -----------------------------------------------------

_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "s": " ",
                   "\\": "\\", '"': '"', "'": "'"}


def _unescape(text, pos):
    """One C escape of systemd's cunescape at text[pos] (after the backslash) -> (chars, new pos)."""
    char = text[pos]
    if char in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[char], pos + 1
    if char == "x":
        return chr(int(text[pos + 1:pos + 3], 16)), pos + 3
    raise AssertionError("escape \\%s that our quoting never writes, in %r" % (char, text))


def split_exec(value, instance="0"):
    """An ExecStart= value -> argv, as systemd reads it: specifiers, words, then $$ at exec."""
    expanded = re.sub(r"%(.)", lambda m: {"%": "%", "i": instance}[m.group(1)], value)
    words, pos = [], 0
    while True:
        while pos < len(expanded) and expanded[pos] in " \t":
            pos += 1
        if pos == len(expanded):
            break
        word, quote = "", None
        while pos < len(expanded):
            char = expanded[pos]
            if quote is None and char in " \t":
                break
            if char == "\\":
                if expanded[pos + 1] == ";" and quote is None:
                    word, pos = word + ";", pos + 2
                    continue
                piece, pos = _unescape(expanded, pos + 1)
                word += piece
                continue
            if quote is None and char in "\"'":
                quote, pos = char, pos + 1
            elif char == quote:
                quote, pos = None, pos + 1
            else:
                word, pos = word + char, pos + 1
        assert quote is None, "unbalanced quote in %r" % value
        words.append(word)
    for word in words:
        assert not re.search(r"(?<!\$)\$(?!\$)", word.replace("$$", "")), "unexpanded $ in %r" % word
    return [word.replace("$$", "$") for word in words]


def settings_of(unit_text):
    """[(key, value)] of a unit file, comments and sections dropped."""
    pairs = []
    for line in unit_text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            pairs.append((key, value))
    return pairs


def one(unit_text, key):
    values = [value for name, value in settings_of(unit_text) if name == key]
    assert len(values) == 1, "%s: %r" % (key, values)
    return values[0]


# --- rendering with Ansible ------------------------------------------------------------------------

RENDER_PLAYBOOK = """\
- name: Render the inference_service templates
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    template_vars: &template_vars
      _inference_service_cfg: "{{ item.service }}"
      _inference_service_unit: "{{ item.service.name }}"
      _inference_service_request: "{{ item.request }}"
      _inference_service_plan: "{{ item.plan }}"
      _inference_service_systemd_version: "{{ item.systemd_version }}"
      inference_service_numa_pin: "{{ item.numa_pin }}"
      inference_service_plan_dir: /etc/inferops-numa
    outcomes: []
  tasks:
    # The template lookup runs on the controller only: one playbook renders every case in seconds. Each case
    # in a block of its own: before ansible-core 2.19 a failing item failed a loop task whole.
    - name: Render every case
      ansible.builtin.include_tasks: render_case.yml
      vars: *template_vars
      loop: "{{ cases }}"
      loop_control:
        label: "{{ item.id }}"

    # ... and the template module, which the role uses, renders the same text.
    - name: Render the first case with the template module
      ansible.builtin.template:
        src: "{{ templates }}/{{ item.template }}"
        dest: "{{ out }}/module-{{ item.id }}"
        mode: "0644"
      vars: *template_vars
      loop: "{{ cases[:1] }}"
      ignore_errors: true

    - name: Keep the outcome of every case
      ansible.builtin.copy:
        content: "{{ outcomes | to_json }}"
        dest: "{{ out }}/results.json"
        mode: "0644"
"""

RENDER_CASE = """\
- name: Render one case
  block:
    - name: Render the case
      ansible.builtin.set_fact:
        outcomes: "{{ outcomes + [[lookup('ansible.builtin.template', templates ~ '/' ~ item.template), '', false]] }}"
  rescue:
    - name: Keep why it failed
      ansible.builtin.set_fact:
        outcomes: "{{ outcomes + [['', ansible_failed_result.msg, true]] }}"
"""


def case(case_id, template="service@.service.j2", service=None, request=None, plan=None, systemd_version=252,
         numa_pin="/usr/local/bin/numa-pin"):
    return {"id": case_id, "template": template, "service": dict(SEED_SERVICE, **(service or {})),
            "request": dict(SEED_REQUEST, **(request or {})), "plan": dict(PLAN_NODE1, **(plan or {})),
            "systemd_version": systemd_version, "numa_pin": numa_pin}


DROPIN = "numa-placement.conf.j2"


def cases(helper):
    return [
        case("seed-wrapper", numa_pin=helper),
        case("hostile-wrapper", service={"command": ["/bin/echo"] + HOSTILE}, numa_pin=helper),
        case("hostile-env", service={"environment": {"A": "x y", "B": "%i$HOME", "C": 'q"\\', "D": ""}},
             numa_pin=helper),
        case("newline-argv", service={"command": ["/bin/echo", "line1\nline2"]}, numa_pin=helper),
        case("newline-env", service={"environment": {"A": "x\ny"}}, numa_pin=helper),
        case("bad-env-name", service={"environment": {"A-B": "x"}}, numa_pin=helper),
        case("shell-string", service={"command": "/bin/echo hello"}, numa_pin=helper),
        case("prefix-executable", service={"command": ["-/bin/echo", "x"]}, numa_pin=helper),
        case("extras", service={"hardening": False, "extra_settings": {"LimitMEMLOCK": "infinity"},
                                "description": "100% llama", "read_write_paths": ["/srv/cache"],
                                "working_directory": "/srv"}, numa_pin=helper),
        case("replicate", service={"replica_dir": "/srv/replicas", "read_write_paths": ["/srv/cache"]},
             request={"page_cache": "replicate", "replica_dir": "/srv/replicas"}, numa_pin=helper),
        case("bad-extra", service={"extra_settings": {"ExecStartPre=/bin/sh #": "x"}}, numa_pin=helper),
        case("systemd-template", service={"pin_mode": "systemd"}, numa_pin=helper),
        case("systemd-dropin", DROPIN, service={"command": ["/bin/echo", "-t", "{threads}", "--port", "{port}",
                                                            "{cpulist}", "%n"]}),
        case("systemd-interleave", DROPIN, service={"command": ["/bin/echo"]},
             plan={"policy": "interleave", "mem_nodes": [0, 1], "cpulist": "0-3", "cpus": [0, 1, 2, 3]}),
        case("systemd-weighted", DROPIN, service={"command": ["/bin/echo"]}, plan={"policy": "weighted-interleave"}),
        case("systemd-old", DROPIN, service={"command": ["/bin/echo"]}, systemd_version=242),
        case("systemd-no-port", DROPIN, service={"command": ["/bin/echo", "{port}"]}, plan={"port": None}),
        case("docker-wrapper", service=DOCKER_SERVICE, request={"container_runtime": "docker"}, numa_pin=helper),
        case("podman-dropin", DROPIN, service=PODMAN_SERVICE, request={"container_runtime": "podman"}),
        case("docker-dropin-interleave", DROPIN, service=DOCKER_SERVICE, request={"container_runtime": "docker"},
             plan={"policy": "interleave", "mem_nodes": [0, 1], "cpulist": "0-3", "cpus": [0, 1, 2, 3]}),
    ]


# Container services as the numa_service_entries filter converts them (tests/unit/test_containers.py checks that).
DOCKER_SERVICE = {"name": "vllm", "user": "root", "group": "root", "hardening": False, "type": "exec",
                  "container": {"runtime": "docker", "program": "/usr/bin/docker", "image": "vllm/vllm-openai"},
                  "command": ["/usr/bin/docker", "run", "--rm", "--name", "vllm-{instance}", "--network", "host",
                              "--cidfile", "/run/inferops-numa-vllm-{instance}.cid", "vllm/vllm-openai",
                              "--port", "{port}"]}
PODMAN_SERVICE = dict(DOCKER_SERVICE, container={"runtime": "podman", "program": "/usr/bin/podman", "image": "img"},
                      command=["/usr/bin/podman", "run", "--rm", "--name", "vllm-{instance}", "img", "--port", "{port}"])


# --- wrapper mode -------------------------------------------------------------------------------


# --- systemd mode --------------------------------------------------------------------------------


# --- the escaping functions themselves -------------------------------------------------------------

ARG = st.text(alphabet=st.characters(blacklist_characters="\n\r\x00", blacklist_categories=("Cs",)), max_size=12)


@given(st.lists(ARG, max_size=8))
@settings(max_examples=300, deadline=None)
def test_any_argv_without_newlines_round_trips(args):
    assert split_exec(unit_text.exec_line(["/bin/echo"] + args)) == ["/bin/echo"] + args


def test_safe_words_stay_bare_and_others_are_quoted():
    assert unit_text.exec_line(["/usr/bin/x", "--port=8080", "{threads}", "a b", "50%", "$X"]) == \
        '/usr/bin/x --port=8080 {threads} "a b" 50%% "$$X"'


@pytest.mark.parametrize("argv", [[], "x", ["x\ny"], ["+/bin/x"], [""], [1]])
def test_bad_commands_are_refused(argv):
    with pytest.raises(NumaError):
        unit_text.exec_line(argv)


def test_the_executable_path_is_written_exactly():
    # systemd does not expand "$" in the path it executes, but does in argv[0]: "@" names both.
    assert unit_text.exec_line(["/opt/a$b/50%/x", "$y"]) == '"@/opt/a$b/50%%/x" "/opt/a$$b/50%%/x" "$$y"'
    assert unit_text.exec_line(["llama-server"]) == "llama-server"  # looked up by systemd
    # As an argument of numa-pin exec, the server's path is a word like any other.
    assert unit_text.command_args(["/opt/a$b/x", "-t"]) == '"/opt/a$$b/x" -t'


@pytest.mark.parametrize("executable", ["/opt/it's/x", '/a"b', "/a\\b", "/a\tb", "/a\x7fb", "/opt/bin/", "bin/x",
                                        "..", "-/bin/x", "", "x\n"])
@pytest.mark.parametrize("render", [unit_text.exec_line, unit_text.command_args])
def test_executables_systemd_would_refuse_or_misread_are_refused(render, executable):
    with pytest.raises(NumaError, match="executable|command"):
        render([executable, "arg"])


@pytest.mark.parametrize("value, written", [
    ("100% llama", "100%% llama"), ("a \\\\", "a \\\\"), ("tab in", "tab in"), (8, "8"), ("ü", "ü")])
def test_setting_values_read_back_as_written(value, written):
    assert unit_text.setting_value(value, "description") == written


@pytest.mark.parametrize("value, cause", [
    ("ends in \\", "ends with a backslash"), ("\\\\\\", "ends with a backslash"), (" x", "whitespace"),
    ("x ", "whitespace"), ("a\tb", "control character"), ("bell\x07", "control character"),
    ("a\nb", "newline"), ("a\rb", "carriage return"), ("a\x00", "NUL"), (True, "quote it"), (None, "quote it"),
])
def test_setting_values_systemd_would_misread_are_refused(value, cause):
    with pytest.raises(NumaError, match=cause):
        unit_text.setting_value(value, "description")
    with pytest.raises(NumaError, match=cause):
        unit_text.extra_setting_value(value, "PAMName")


@pytest.mark.parametrize("name", ["llama", "_svc-1", "a.b", "a b", "a@b", "0", "1000", 1000, "4294967294", "x%%y"])
def test_accounts_systemd_applies_are_written(name):
    assert unit_text.account_name(name) == str(name).replace("%", "%%")


@pytest.mark.parametrize("name", ["", "a:b", "a/b", ".", "..", "-1", "007", "65535", "4294967295", "99999999999",
                                  "svc\\", " svc", "a\tb"])
def test_accounts_systemd_would_ignore_are_refused(name):
    with pytest.raises(NumaError, match="user"):
        unit_text.account_name(name, "user")


def test_extra_settings_keep_a_final_percent_and_refuse_others():
    assert unit_text.extra_setting_value("50%", "CPUQuota") == "50%"
    assert unit_text.extra_setting_value("infinity", "LimitMEMLOCK") == "infinity"
    for value in ("%i", "a%%b", "100%%"):
        with pytest.raises(NumaError, match="specifier"):
            unit_text.extra_setting_value(value, "SyslogIdentifier")


def test_request_lists_become_what_numa_pin_takes():
    assert unit_text.request_flags({"gpus": ["0000:81:00.0", "0000:c1:00.0"], "model": ["/a b", "/c,d"]}) == [
        "--gpus", "0000:81:00.0,0000:c1:00.0", "--model", "/a b", "--model", "/c,d"]
    assert unit_text.request_flags({"model": "/srv/m.gguf", "gpus": 2}) == ["--gpus", "2", "--model", "/srv/m.gguf"]


@pytest.mark.parametrize("request_, cause", [
    ({"gpus": ["0000:81:00.0,0000:c1:00.0"]}, "holding a comma"), ({"smt": "no"}, "true or false"),
    ({"gpus": True}, "string or a number"), ({"gpus": [["x"]]}, "string or a number"),
    ({"reserve_cpus": "-1"}, "read as a flag"), ({"model": ["--help"]}, "read as a flag"),
])
def test_request_values_numa_pin_would_misread_are_refused(request_, cause):
    with pytest.raises(NumaError, match=cause):
        unit_text.request_flags(request_)


def test_request_flags_follow_the_cli_contract():
    assert unit_text.request_flags({"instances": 2, "smt": False, "reserve_cpus": "0-1", "gpus": 1, "policy": None,
                                  "port_base": 8080, "page_cache": "evict", "on_unfit": "fail"}) == [
        "--gpus", "1", "--no-smt", "--reserve-cpus", "0-1", "--instances", "2", "--on-unfit", "fail",
        "--page-cache", "evict", "--port-base", "8080"]
    with pytest.raises(NumaError, match="unknown placement option"):
        unit_text.request_flags({"threads": 4})


def test_tokens_are_replaced_exactly():
    plan = {"threads": 28, "node": 1, "cpulist": "28-55", "instance": 1, "port": 8081}
    assert substitute_tokens(["-t", "{threads}", "--cpus={cpulist}", '{"a": {node}}', "{other}"], plan) == \
        ["-t", "28", "--cpus=28-55", '{"a": 1}', "{other}"]


def test_plan_record_drops_what_moves_between_runs():
    record = unit_text.plan_record(PLAN_NODE1)
    assert "available_bytes" not in record and "reasons" not in record
    assert record["cpulist"] == "28-31" and record["port"] == 8081 and record["node"] == 1
    spread_from_0 = dict(PLAN_NODE1, policy="interleave", mem_nodes=[0, 1], node=0)
    spread_from_1 = dict(spread_from_0, node=1)
    assert unit_text.plan_record(spread_from_0) == unit_text.plan_record(spread_from_1)


def test_a_record_is_current_only_when_root_wrote_exactly_it(trusted_dir):
    record = unit_text.plan_record(PLAN_NODE1)
    directory = pathlib.Path(trusted_dir)
    path = directory / "llama@1.plan.json"
    assert not unit_text.record_is_current(str(path), record)  # missing
    path.write_text(json.dumps(record, indent=4) + "\n")
    os.chmod(str(path), 0o644)
    assert unit_text.record_is_current(str(path), record)  # formatting does not matter, content does
    assert not unit_text.record_is_current(str(path), dict(record, cpulist="0-3"))
    os.chmod(str(path), 0o666)
    assert not unit_text.record_is_current(str(path), record)  # writable by others: rewrite it
    os.chmod(str(path), 0o644)
    link = directory / "link.plan.json"
    link.symlink_to(path)
    assert not unit_text.record_is_current(str(link), record)
    path.write_text("{not json")
    assert not unit_text.record_is_current(str(path), record)
    assert not unit_text.record_is_current(str(directory), record)  # a directory
    os.chmod(str(directory), 0o777)
    path.write_text(json.dumps(record))
    assert not unit_text.record_is_current(str(path), record)  # in a directory others may write


def test_systemd_version_is_read_from_systemctl():
    assert unit_text.parse_systemd_version("systemd 252 (252.39-1~deb12u2)\n+PAM +AUDIT") == 252
    with pytest.raises(NumaError, match="cannot read the systemd version"):
        unit_text.parse_systemd_version("bash: systemctl: command not found")


def test_preferred_on_several_nodes_needs_the_wrapper():
    with pytest.raises(NumaError, match="use pin_mode wrapper"):
        unit_text.numa_settings({"policy": "preferred", "mem_nodes": [0, 1], "cpulist": "0-3"}, 252)


def test_service_names_must_make_unit_names():
    assert unit_text.unit_prefix("llama-3.1_70b") == "llama-3.1_70b"
    for bad in ("a@b", "two words", "", "x/y", "llama:7b", ".", ".."):
        with pytest.raises(NumaError):
            unit_text.unit_prefix(bad)


@pytest.mark.parametrize("name", ["INFEROPS_NUMA_AB_BASELINE", "INFEROPS_NUMA_ANYTHING"])
def test_a_service_environment_cannot_set_numa_pins_own_variables(name):
    with pytest.raises(NumaError, match="environment variable %s is numa-pin's own" % name):
        unit_text.environment_lines({name: "unbound"})
    assert unit_text.environment_lines({"INFEROPS": "x"}) == ['"INFEROPS=x"']
