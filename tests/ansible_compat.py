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
    """An empty warning store for this test, of the type this core keeps (a list before 2.19, a dict since).

    Since 2.19, importing controller code (ansible.errors: a filter plugin) sends module warnings to the
    display instead of the result for the rest of the process; a test module that does so at import breaks
    every warning test after it, so that is named here instead of failing them one by one.
    """
    assert not _controller_mode(), ("a test module imported ansible controller code (ansible.errors, a filter "
                                    "plugin) in this process: module warnings no longer reach results; import it "
                                    "in a subprocess")
    monkeypatch.setattr(ansible_warnings, "_global_warnings", type(ansible_warnings._global_warnings)())


def _controller_mode():
    try:
        from ansible.module_utils import _internal
    except ImportError:  # ansible-core < 2.19 has no such mode
        return False
    return getattr(_internal, "is_controller", False)
