"""What the tests take from ansible-core, on every core galaxy.yml's requires_ansible admits.

ansible-core 2.19 added ``ansible.module_utils.testing.patch_module_args`` and made the warning store
a dict; older cores read module arguments from ``basic._ANSIBLE_ARGS`` (the way their developer guide
sets them) and keep warnings in a list. tests/matrix.py runs the tests on the oldest and newest core.
"""

import contextlib
import json
from unittest import mock

from ansible.module_utils import basic
from ansible.module_utils.common import warnings as ansible_warnings

try:
    from ansible.module_utils.testing import patch_module_args
except ImportError:  # ansible-core < 2.19
    @contextlib.contextmanager
    def patch_module_args(args=None):
        """Expose ``args`` to the AnsibleModule instances created within this context."""
        encoded = json.dumps({"ANSIBLE_MODULE_ARGS": args or {}}).encode()
        with mock.patch.object(basic, "_ANSIBLE_ARGS", encoded):
            yield


def clear_warnings(monkeypatch):
    """An empty warning store for this test, of the type this core keeps (a list before 2.19, a dict since), and
    the module code in target mode, as in the module's own process on a host.

    Since 2.19, importing controller code (ansible.errors: a filter plugin, which the report tests do in this
    process) switches module code to controller mode for the rest of the process: its warnings go to the display
    instead of the result. A real module run is a fresh process that never imported controller code, so for this
    test the mode is the target's, whatever the tests before it imported (the suite runs in any order); the
    monkeypatch puts the process's mode back after it.
    """
    internal = _internal_state()
    if internal is not None:
        monkeypatch.setattr(internal, "is_controller", False)
    monkeypatch.setattr(ansible_warnings, "_global_warnings", type(ansible_warnings._global_warnings)())


def _internal_state():
    try:
        from ansible.module_utils import _internal
    except ImportError:  # ansible-core < 2.19 has no such mode
        return None
    return _internal if hasattr(_internal, "is_controller") else None
