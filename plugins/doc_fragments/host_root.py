# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation the collection's host modules share, written once."""

from __future__ import annotations


class ModuleDocFragment:
    # The root prefix every reader and writer takes (kernel_files.Root and the file layer resolve inside it).
    DOCUMENTATION = r"""
options:
  root:
    description:
      - Work on the machine whose files are under this directory instead of this host's own, like hwloc's
        C(HWLOC_FSROOT) - the module's C(sys/), C(proc/) and C(etc/) paths are taken under it, and nothing
        outside it is read or written. Point it at a captured machine, or a copy for tests and dry runs.
      - Commands a module runs (C(systemctl)) still ask this host's running system.
    type: path
    default: /
"""

    # A module that only reads: check mode runs it whole, and it has no file to show a diff of.
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: linux
"""
