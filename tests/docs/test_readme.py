"""Every command README.md shows works as written: run, or syntax-checked where it would reach a server.

Commands are the lines of its ``console`` blocks (only the ``$ `` lines where a block has them; the rest is their
output). By the way they start:

- ``make TARGET``: the target exists (``make -n``); the targets boot the lab or run everything, which
  make test does itself;
- ``.venv/bin/ansible ...``: run in the checkout, with this test's Ansible (the matrix runs it on other cores);
- ``.venv/bin/ansible-playbook ...``: ``--syntax-check``, and ``--list-hosts`` must find a host;
- ``numa-pin ...``: run as ``python3 -m numa ...`` from the checkout; output shown under it must match, numbers aside;
- the quick start's commands run one after another in a scratch copy of the checkout with a HOME of their own,
  its ``ansible-playbook`` lines with ``--syntax-check`` and ``--list-hosts`` (no server answers there).

A command of any other form fails the test: a new kind of command needs a way to be checked here.
The ``text`` block of numa-pin's synopsis must name only options its ``--help`` lists.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.tools import ansible_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICK_START = "Quick start: the installed collection"
PLAYBOOK_NAMES = re.compile(r"(?<![\w/.-])(site\.yml|playbooks/\w+\.yml|inferops\.numa\.(?:site|cost_report))\b")


def readme():
    with open(os.path.join(REPO, "README.md")) as handle:
        return handle.read()


def blocks(text, language):
    """[(section heading, [lines])] of the fenced blocks in ``language``."""
    found, heading, inside, lines = [], None, None, []
    for line in text.splitlines():
        if inside is None and line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif inside is None and line.startswith("```"):
            inside, lines = line[3:].strip(), []
        elif inside is not None and line.startswith("```"):
            if inside == language:
                found.append((heading, lines))
            inside = None
        elif inside is not None:
            lines.append(line)
    return found


def commands(lines):
    """[(command, [the output lines shown under it])] of one console block."""
    prompted = any(line.startswith("$ ") for line in lines)
    result = []
    for line in lines:
        if prompted and not line.startswith("$ "):
            if result:
                result[-1][1].append(line)
            continue
        command = re.sub(r"\s{2,}#.*$", "", line[2:] if prompted else line).strip()
        if command and not command.startswith("#"):
            result.append((command, []))
    return result


def console_commands():
    return [(heading, command, output) for heading, lines in blocks(readme(), "console")
            for command, output in commands(lines)]


def _ansible_env():
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env["ANSIBLE_NOCOLOR"] = "1"
    return env


def _run(argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, **kwargs)


def _ansible_tool(command):
    """``.venv/bin/ansible-x ...`` with this interpreter's Ansible (the pinned one in make test's unit phase)."""
    words = shlex.split(command)
    words[0] = ansible_command(os.path.basename(words[0]))
    return words


def check_make(command):
    words = shlex.split(command)
    done = _run(["make", "-n", "--no-print-directory"] + words[1:], cwd=REPO)
    assert done.returncode == 0, "%s: %s" % (command, done.stderr)


def check_adhoc(command):
    done = _run(_ansible_tool(command), cwd=REPO, env=_ansible_env())
    assert done.returncode == 0, "%s:\n%s%s" % (command, done.stdout[-2000:], done.stderr[-2000:])
    assert "[WARNING]" not in done.stderr, "%s:\n%s" % (command, done.stderr)


def check_playbook(command, cwd=REPO, env=None):
    for extra in ("--syntax-check", "--list-hosts"):
        done = _run(_ansible_tool(command) + [extra], cwd=cwd, env=env or _ansible_env())
        assert done.returncode == 0, "%s %s:\n%s%s" % (command, extra, done.stdout[-2000:], done.stderr[-2000:])
        if extra == "--list-hosts":
            counts = [int(n) for n in re.findall(r"hosts \((\d+)\):", done.stdout)]
            assert counts and min(counts) > 0, "%s matches no host:\n%s" % (command, done.stdout)


def check_numa_pin(command, output):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "plugins", "module_utils"))
    done = _run([sys.executable, "-m", "numa"] + shlex.split(command)[1:], cwd=REPO, env=env)
    assert done.returncode == 0, "%s: %s" % (command, done.stderr)
    for shown in output:
        pattern = re.sub(r"\d[\d,\-\\]*", r"[\\d,\\-]+", re.escape(shown))
        assert re.search("^%s$" % pattern, done.stdout + done.stderr, re.MULTILINE), (command, shown, done.stderr)


CHECKS = ((lambda command: command.startswith("make "), "make"),
          (lambda command: command.startswith(".venv/bin/ansible-playbook "), "playbook"),
          (lambda command: command.startswith(".venv/bin/ansible "), "adhoc"),
          (lambda command: command.startswith("numa-pin "), "numa-pin"))


def kind(command):
    return next((name for matches, name in CHECKS if matches(command)), None)


def test_every_command_has_a_check():
    found = console_commands()
    assert len(found) >= 10
    unchecked = [command for heading, command, _ in found if heading != QUICK_START and kind(command) is None]
    assert unchecked == [], "README commands this test cannot check: %s" % unchecked
    assert [command for heading, command, _ in found if heading == QUICK_START]


@pytest.mark.parametrize("command, output", [(command, output) for heading, command, output in console_commands()
                                             if heading != QUICK_START and kind(command)],
                         ids=lambda value: value if isinstance(value, str) else "")
def test_the_command_works_as_written(command, output):
    checker = kind(command)
    if checker == "make":
        check_make(command)
    elif checker == "adhoc":
        check_adhoc(command)
    elif checker == "playbook":
        check_playbook(command)
    else:
        check_numa_pin(command, output)


def test_every_playbook_the_readme_names_passes_a_syntax_check():
    named = sorted(set(PLAYBOOK_NAMES.findall(readme())))
    assert "site.yml" in named and "playbooks/cost_report.yml" in named
    for playbook in (name for name in named if name.endswith(".yml")):
        done = _run([ansible_command("ansible-playbook"), "-i", "inventory/example", "--syntax-check", playbook],
                    cwd=REPO, env=_ansible_env())
        assert done.returncode == 0, "%s: %s" % (playbook, done.stderr[-2000:])
    quick_start = " ".join(command for heading, command, _ in console_commands() if heading == QUICK_START)
    for playbook in (name for name in named if not name.endswith(".yml")):
        assert playbook in quick_start, "%s is named but the quick start never runs it" % playbook


def test_numa_pin_synopsis_names_only_options_its_help_lists():
    (synopsis,) = [lines for heading, lines in blocks(readme(), "text") if heading == "`numa-pin`"]
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "plugins", "module_utils"))
    for line in synopsis:
        words = line.split("#")[0].split()
        command = [words[1]] if not words[1].startswith("-") else []
        done = _run([sys.executable, "-m", "numa"] + command + ["--help"], env=env)
        assert done.returncode == 0, line
        for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", line.split("#")[0]):
            assert flag in done.stdout, (line, flag)


def _scratch_checkout(target):
    """The checkout's tracked and new files, as a fresh clone has them (no .venv, no build/)."""
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: %s" % listed.stderr.strip())
    for rel in filter(None, listed.stdout.split("\0")):
        source = os.path.join(REPO, rel)
        if os.path.isfile(source):
            os.makedirs(os.path.join(target, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(source, os.path.join(target, rel))


def test_the_quick_start_installs_the_collection_and_finds_the_fleet(tmp_path):
    checkout, home = tmp_path / "checkout", tmp_path / "home"
    home.mkdir()
    _scratch_checkout(str(checkout))
    env = dict(_ansible_env(), HOME=str(home),
               PATH=os.pathsep.join([os.path.dirname(ansible_command("ansible-playbook")), os.environ["PATH"]]))
    script = ["set -euo pipefail"]
    for heading, command, _ in console_commands():
        if heading != QUICK_START:
            continue
        if command.startswith("ansible-playbook "):
            script += [command + " --syntax-check", command + " --list-hosts"]
        else:
            script.append(command)
    done = _run(["bash", "-c", "\n".join(script)], cwd=str(checkout), env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    installed = home / ".ansible" / "collections" / "ansible_collections" / "inferops" / "numa"
    assert (installed / "MANIFEST.json").is_file() and not installed.is_symlink()
    assert re.search(r"hosts \(1\):\s+llm-01", done.stdout), done.stdout
    assert "inference_service_list" in (home / "inferops-numa" / "my-fleet" / "group_vars" / "llm_cpu.yml").read_text()
