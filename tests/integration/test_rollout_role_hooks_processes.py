"""The traffic hooks through the inference_service role, run end to end by ansible-playbook against the fake
systemd and the stand-in engine (tests/integration/test_rollout_role_processes.py's box): the entry's
drain_command and undrain_command reach numa_rollout with their tokens filled, stop_timeout_seconds reaches the
unit, and a bad hook is refused by the preflight before anything is written."""

import os
import sys

from tests.integration.test_rollout_role_processes import box, _recap  # noqa: F401  # pylint: disable=unused-import

# A hook: one line per run, its arguments as numa_rollout gave them.
HOOK = "import sys\nwith open(sys.argv[1], 'a') as handle:\n    handle.write(' '.join(sys.argv[2:]) + '\\n')\n"


def _hooked(box, log, **changes):  # pylint: disable=redefined-outer-name
    script = os.path.join(str(box.tmp_path), "hook.py")
    with open(script, "w") as handle:
        handle.write(HOOK)
    command = [sys.executable, script, log]
    return box.entry(drain_command=command + ["drain", "{service}", "{unit}", "{instance}", "{port}"],
                     undrain_command=command + ["undrain", "{unit}", "{port}"], stop_timeout_seconds=30,
                     audit=False, **changes)


def test_the_roles_hooks_wrap_a_restart_and_its_stop_timeout_is_the_units(box):  # pylint: disable=redefined-outer-name
    log = os.path.join(str(box.tmp_path), "hooks.log")
    code, output, _failure = box.run(_hooked(box, log))
    assert code == 0, output
    with open(os.path.join(box.fake.unit_dir, "llm@.service")) as handle:
        assert "\nTimeoutStopSec=30\n" in handle.read()
    assert box.fake.show("llm@0.service", "TimeoutStopUSec")["TimeoutStopUSec"] in ("30s", "30000000"), output
    with open(log) as handle:  # a first start: nothing to drain
        assert handle.read().splitlines() == ["undrain llm@0.service %d" % box.port]
    os.remove(log)
    code, output, _failure = box.run(_hooked(box, log, rate=20.0))
    assert code == 0, output
    with open(log) as handle:
        assert handle.read().splitlines() == ["drain llm llm@0.service 0 %d" % box.port,
                                              "undrain llm@0.service %d" % box.port]
    code, output, _failure = box.run(_hooked(box, log, rate=20.0))
    assert code == 0 and _recap(output)[0] == "0", output  # nothing changed: no hook ran


def test_a_hook_with_an_unknown_token_is_refused_before_any_change(box):  # pylint: disable=redefined-outer-name
    code, output, _failure = box.run(box.entry(drain_command=["lb", "{unti}"]))
    assert code != 0
    assert "service llm: drain_command: {unti}: no such token" in output, output
    assert not os.path.exists(os.path.join(box.fake.unit_dir, "llm@.service"))
