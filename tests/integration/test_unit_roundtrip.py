"""Units the role renders, read back by systemd itself: what systemd runs is what the service asked for.

Hypothesis draws batches of services with hostile values (paths holding ``$``, ``%``, quotes,
``;`` or spaces, arguments with any character a line can hold, descriptions ending in
backslashes, user names, environment values, extra settings). Ansible renders the role's
templates for each, in both pin modes, and systemd reads the units back two ways, neither
needing a running manager:

- ``systemd --test --user`` (the manager's own unit loader, as an unprivileged user) dumps
  every loaded unit: its stored ``ExecStart=`` words, ``Description``, ``User``, ``Group``,
  ``Environment`` and string settings, and logs every line it ignores;
- ``systemd-analyze verify`` names the file each ``ExecStart=`` executes ("Command ... is not
  executable", as the generated paths do not exist).

A service drawn from values systemd can hold must render and read back exactly; any other
service must read back exactly or be refused with a one-line error naming the value.
"""

import contextlib
import os
import pathlib
import pwd
import re
import shutil
import subprocess
import tempfile

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.base.tokens import substitute_tokens

from tests.integration.test_units_processes import render_cases
from tests.tools import needs
from tests.unit.test_units import DROPIN, PLAN_NODE1, case

ANALYZE = shutil.which("systemd-analyze")
MANAGER = next((path for path in ("/usr/lib/systemd/systemd", "/lib/systemd/systemd") if os.access(path, os.X_OK)),
               None)


def _unprivileged_account():
    """Who runs the manager's test mode, which systemd refuses to root: root hands it to nobody."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


MANAGER_USER = _unprivileged_account()
pytestmark = [
    needs(ANALYZE is None or MANAGER is None, "systemd is not installed (no systemd-analyze or manager binary)"),
    pytest.mark.skipif(MANAGER_USER is None, reason="running as root, with no user nobody to run systemd --test as"),
]

REQUEST = {"gpus": ["0000:81:00.0", "0000:c1:00.0"], "model": ["/srv/a.gguf", "/srv/b b.gguf"],
           "model_size": "14G", "instances": 2, "policy": "bind", "smt": False, "port_base": 8080}
# The numa-pin exec flags REQUEST stands for, in request.py's option order.
REQUEST_FLAGS = ["--gpus", "0000:81:00.0,0000:c1:00.0", "--model-size", "14G", "--model", "/srv/a.gguf",
                 "--model", "/srv/b b.gguf", "--no-smt", "--instances", "2", "--policy", "bind",
                 "--port-base", "8080"]
INSTANCE = "1"
# What the manager logs that says nothing against the units: its timing, and a name it takes
# although it would not suggest it (systemd.io/USER_NAMES).
NOT_COMPLAINTS = ("Loaded units and determined", "Accepting user/group name ")


# --- what services may hold ---------------------------------------------------------------------

def _untemplated(text):
    """Ansible renders a variable holding a Jinja start before the template sees it."""
    return not any(mark in text for mark in ("{{", "{%", "{#"))


def _text(alphabet, min_size=0, max_size=10):
    return st.text(alphabet, min_size=min_size, max_size=max_size).filter(_untemplated)


ANY_CHAR = st.characters(blacklist_categories=("Cs",))
LINE_CHAR = st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x00")
PRINTABLE = st.characters(blacklist_categories=("Cs", "Cc"))
PATH_CHAR = st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\\"'")
ANY_TEXT = _text(ANY_CHAR)

ARGUMENT = _text(LINE_CHAR)
PATH = st.lists(_text(PATH_CHAR, min_size=1, max_size=6), min_size=1, max_size=3).map(
    lambda parts: "/" + "/".join(parts))
DESCRIPTION = st.tuples(_text(PRINTABLE, max_size=12), st.sampled_from(["", "\\\\"])).map(
    lambda pair: pair[0].strip(" ").rstrip("\\") + pair[1])
ACCOUNT = st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,30}", fullmatch=True),
                    st.integers(1, 2 ** 32 - 2).filter(lambda uid: uid != 65535),
                    st.integers(1, 2 ** 32 - 2).filter(lambda uid: uid != 65535).map(str))
ENV_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
PAM_NAME = st.tuples(_text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="%\\"),
                           min_size=1), st.sampled_from(["", "%"])).map(lambda pair: pair[0].strip(" ") + pair[1])


def _service(command, description, user, group, environment, pam_name):
    return {"command": command, "description": description, "user": user, "group": group,
            "environment": environment, "hardening": False,
            "extra_settings": {"PAMName": pam_name, "CPUQuota": "50%"}}


WRITABLE_SERVICE = st.builds(
    _service, command=st.builds(lambda path, args: [path] + args, PATH, st.lists(ARGUMENT, max_size=5)),
    description=DESCRIPTION, user=st.one_of(st.none(), ACCOUNT), group=st.one_of(st.none(), ACCOUNT),
    environment=st.dictionaries(ENV_NAME, ARGUMENT, max_size=3), pam_name=PAM_NAME.filter(bool))
ANY_SERVICE = st.builds(
    _service, command=st.lists(ANY_TEXT, min_size=1, max_size=4), description=ANY_TEXT,
    user=st.one_of(st.none(), ANY_TEXT), group=st.one_of(st.none(), ANY_TEXT),
    environment=st.dictionaries(ENV_NAME, ANY_TEXT, max_size=2), pam_name=ANY_TEXT.filter(bool))
# (writable, service): a writable service must render; any other may be refused.
SERVICE = st.booleans().flatmap(
    lambda writable: (WRITABLE_SERVICE if writable else ANY_SERVICE).map(lambda service: (writable, service)))
# The path of numa-pin, and the services.
BATCH = st.tuples(PATH, st.lists(SERVICE, min_size=8, max_size=8))

# What issue 14 found: a trailing backslash joined the next line to Description=, User= or an
# extra setting; "$" in the executable was doubled; "%" in CPUQuota= was doubled (and is a
# specifier in PAMName=); User=/Group= systemd ignores ran the service as root.
ISSUE_14 = ("/opt/numa $pin/numa-pin", [
    (False, _service(["/usr/bin/llama-server"], "ends in \\", None, None, {}, "login")),
    (False, _service(["/usr/bin/llama-server"], "", "svc\\", None, {}, "login")),
    (False, _service(["/usr/bin/llama-server"], "", None, None, {}, "login\\")),
    (False, _service(["/usr/bin/llama-server"], "", None, None, {}, "a%nb")),
    (False, _service(["/usr/bin/llama-server"], "", "llama:7b", "..", {}, "login")),
    (True, _service(["/opt/$HOME/50%/bin/server", "$HOME", "${X}", "a\\", "%i"], "50% of \\\\", "1000",
                    None, {"A": "$B \\"}, "login%")),
])


# --- systemd reading units back ------------------------------------------------------------------

def _unquote_command_line(line):
    """The words of a dump's "Command Line:", undoing systemd's shell_maybe_quote: a word with
    special characters is double-quoted, with \\ before \\ " ` $ and control characters C-escaped."""
    words = []
    for match in re.finditer(r'"((?:[^"\\]|\\.)*)"|(\S+)', line):
        if match.group(2) is not None:
            words.append(match.group(2))
        else:
            words.append(re.sub(r"\\([0-7]{3}|.)", _unescape_dumped, match.group(1)))
    return words


def _unescape_dumped(match):
    escape = match.group(1)
    if len(escape) == 3:
        return chr(int(escape, 8))
    return {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}.get(escape, escape)


def dumped_units(dump):
    """{unit: {key: [values], "argv": [words of each ExecStart=]}} from ``systemd --test``'s dump."""
    units, current = {}, None
    for line in dump.split("\n"):
        if line.startswith("\t-> Unit ") and line.endswith(":"):
            current = units.setdefault(line[len("\t-> Unit "):-1], {"argv": []})
        elif current is not None and line.startswith("\t\t\tCommand Line: "):
            current["argv"].append(_unquote_command_line(line[len("\t\t\tCommand Line: "):]))
        elif current is not None and line.startswith("\t\t") and not line.startswith("\t\t\t"):
            key, _, value = line[2:].partition(": ")
            current.setdefault(key, []).append(value)
    return units


def _drop_to(account):
    """What the child runs before the manager: become ``account``, with no supplementary groups."""
    def drop():
        os.setgroups([])
        os.setgid(account.pw_gid)
        os.setuid(account.pw_uid)
    return drop


def manager_reads(top, units):
    """(dumped units, complaints) of systemd's manager in test mode loading ``units`` from ``top``/units.

    It runs as MANAGER_USER, which must be able to read ``top``.
    """
    target = os.path.join(top, "units", "roundtrip.target")
    with open(target, "w", encoding="utf-8") as handle:
        handle.write("[Unit]\n" + "".join("Wants=%s\n" % unit for unit in units))
    for private in ("home", "runtime"):
        os.mkdir(os.path.join(top, private), 0o700)
        os.chown(os.path.join(top, private), MANAGER_USER.pw_uid, MANAGER_USER.pw_gid)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.path.join(top, "home"),
           "XDG_RUNTIME_DIR": os.path.join(top, "runtime"), "SYSTEMD_UNIT_PATH": os.path.join(top, "units"),
           "SYSTEMD_LOG_COLOR": "0", "LANG": "C.UTF-8"}
    done = subprocess.run([MANAGER, "--test", "--user", "--unit=roundtrip.target", "--no-pager"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, check=False,
                          preexec_fn=_drop_to(MANAGER_USER) if os.geteuid() == 0 else None)
    stdout, stderr = done.stdout.decode("utf-8"), done.stderr.decode("utf-8")
    assert done.returncode == 0, stderr
    complaints = [line for line in stderr.split("\n") if line and not line.startswith(NOT_COMPLAINTS)]
    return dumped_units(stdout), complaints


def verified_executables(top, units):
    """({unit: the file its ExecStart= runs}, other complaints) from systemd-analyze verify."""
    if not units:
        return {}, []
    paths = [os.path.join(top, "units", unit) for unit in units]
    done = subprocess.run([ANALYZE, "verify", "--man=no", "--generators=no"] + paths, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=60, check=False)
    executables, complaints = {}, []
    for line in done.stdout.decode("utf-8").split("\n"):
        missing = re.match(r"^(\S+): Command (.*) is not executable: No such file or directory$", line)
        if missing:
            executables[missing.group(1)] = missing.group(2)
        elif line and not line.startswith(NOT_COMPLAINTS):
            complaints.append(line)
    return executables, complaints


# --- what each unit must say ---------------------------------------------------------------------

def at_exec(words):
    """Stored ExecStart= words as the program receives them: systemd turns $$ into $ at start,
    and a lone $ would expand a variable, which no word we write may do."""
    for word in words:
        assert "$" not in word.replace("$$", ""), "a word systemd would expand: %r" % word
    return [word.replace("$$", "$") for word in words]


def expected_settings(service, name):
    user = service["user"] or name
    return {"Description": [service["description"] or "%s instance %s (NUMA-pinned by inferops.numa)" % (
                name, INSTANCE)],
            "User": [str(user)], "Group": [str(service["group"] or user)],
            "PAMName": [service["extra_settings"]["PAMName"]],
            "Environment": ["%s=%s" % (key, service["environment"][key]) for key in sorted(service["environment"])]}


def check_refusal(message, case_id):
    assert message, "%s was refused without a message" % case_id
    assert "\n" not in message.strip() and "Traceback" not in message, "%s: %s" % (case_id, message)


def check_rendered_or_refused(rendered, services):
    for index, (writable, _) in enumerate(services):
        for case_id in ("rw%d" % index, "rt%d" % index, "dropin%d" % index):
            text, message = rendered[case_id][:2]
            if writable:
                assert text is not None, "%s should render: %s" % (case_id, message)
            elif text is None:
                check_refusal(message, case_id)


def _cases(helper, services):
    cases = []
    for index, (_, service) in enumerate(services):
        cases.append(case("rw%d" % index, service=dict(service, name="rw%d" % index), request=REQUEST,
                          numa_pin=helper))
        cases.append(case("rt%d" % index, service=dict(service, name="rt%d" % index, pin_mode="systemd"),
                          request=REQUEST, numa_pin=helper))
        cases.append(case("dropin%d" % index, DROPIN, service=dict(service, name="rt%d" % index),
                          request=REQUEST, numa_pin=helper))
    return cases


def install(top, rendered, index):
    """The unit files of service ``index`` in ``top``/units, as the role lays them out; the instances."""
    units = os.path.join(top, "units")
    installed = []
    for name, dropin in (("rw%d" % index, None), ("rt%d" % index, "dropin%d" % index)):
        text = rendered[name][0]
        if text is None or (dropin and rendered[dropin][0] is None):
            continue
        with open(os.path.join(units, "%s@.service" % name), "w", encoding="utf-8") as handle:
            handle.write(text)
        if dropin:
            os.mkdir(os.path.join(units, "%s@%s.service.d" % (name, INSTANCE)))
            with open(os.path.join(units, "%s@%s.service.d" % (name, INSTANCE), "50-inferops-numa.conf"), "w",
                      encoding="utf-8") as handle:
                handle.write(rendered[dropin][0])
        installed.append("%s@%s.service" % (name, INSTANCE))
    return installed


@contextlib.contextmanager
def unit_directory():
    """A fresh directory the manager's test mode can read (as nobody), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="unit-roundtrip-") as top:
        os.chmod(top, 0o755)
        os.mkdir(os.path.join(top, "units"))
        yield top


# Each example runs ansible-playbook (seconds): few examples of many services each, and no
# shrinking, which would take minutes; a failure prints its whole batch.
@settings(max_examples=2, deadline=None, derandomize=True, phases=(Phase.explicit, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=BATCH)
@example(batch=ISSUE_14)
def test_systemd_reads_every_rendered_unit_as_the_service_meant(batch):
    helper, services = batch
    with unit_directory() as top:
        os.mkdir(os.path.join(top, "ansible"))
        rendered = render_cases(_cases(helper, services), pathlib.Path(top, "ansible"), helper)
        check_rendered_or_refused(rendered, services)
        instances = [unit for index in range(len(services)) for unit in install(top, rendered, index)]
        dumped, complaints = manager_reads(top, instances)
        executables, verify_complaints = verified_executables(top, instances)
    assert complaints == [] and verify_complaints == []
    for index, (_, service) in enumerate(services):
        wrapper, placed = "rw%d@%s.service" % (index, INSTANCE), "rt%d@%s.service" % (index, INSTANCE)
        if wrapper in instances:
            check_wrapper_unit(dumped[wrapper], executables[wrapper], helper, service, "rw%d" % index)
        if placed in instances:
            argv = substitute_tokens(service["command"], PLAN_NODE1)
            assert at_exec(dumped[placed]["argv"][-1]) == argv
            assert executables[placed] == argv[0]


def check_wrapper_unit(unit, executable, helper, service, name):
    """numa-pin exec runs with the request's flags and the command; the settings are the service's."""
    assert executable == helper
    assert at_exec(unit["argv"][0]) == (
        [helper, "exec", "--instance", INSTANCE] + REQUEST_FLAGS + ["--"] + service["command"])
    for key, values in expected_settings(service, name).items():
        assert unit.get(key, []) == values, (name, key)
