#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

# The work is done by the action plugin of the same name (plugins/action/numa_report.py), on the controller.

DOCUMENTATION = r"""
---
module: numa_report
short_description: Write the fleet or cost report of every host's registered result, on the controller
version_added: "1.0.0"
description:
  - Reads each host's registered M(inferops.numa.numa_metrics) (O(kind=fleet)) or M(inferops.numa.numa_cost)
    (O(kind=cost)) result from C(hostvars), checks it against what that module returns (types, ranges, list sizes,
    text lengths), and writes one Markdown and one HTML page into O(dest).
  - A host without a result (unreachable, failed, skipped) or whose result does not match is listed with the reason;
    the other hosts are reported. A report with no host to show is written too, saying why.
  - What hosts returned is data, never a template, on every supported ansible-core; every value the pages print is
    escaped for their format (HTML autoescape; Markdown plain text or a code span, one line each).
  - Runs on the controller (an action); C(playbooks/fleet_report.yml) and C(playbooks/cost_report.yml) use it.
author:
  - inferops.numa contributors (@inferops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
options:
  kind:
    description: Which report.
    type: str
    choices: [fleet, cost]
    required: true
  hosts:
    description: The hosts to report, such as C(ansible_play_hosts_all).
    type: list
    elements: str
    required: true
  result:
    description: The name each host registered its result under; C(fleet_report_result) for O(kind=fleet),
      C(numa_cost_result) for O(kind=cost).
    type: str
  dest:
    description: The directory the pages go to (made if missing); default the current directory. Refused inside an
      installed collection.
    type: path
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: all
"""

EXAMPLES = r"""
- name: Read every host's NUMA state
  inferops.numa.numa_metrics:
  register: fleet_report_result
  ignore_errors: true
  ignore_unreachable: true

- name: Write the fleet report on the controller
  inferops.numa.numa_report:
    kind: fleet
    hosts: "{{ ansible_play_hosts_all }}"
    dest: reports
  run_once: true
  delegate_to: localhost
"""

RETURN = r"""
paths:
  description: The pages written (or that would be, in check mode).
  returned: success
  type: list
  elements: str
  sample: [/srv/reports/fleet_report.md, /srv/reports/fleet_report.html]
host_count:
  description: The hosts of the report.
  returned: success
  type: int
  sample: 200
without_result:
  description: The hosts listed without a result (unreachable, failed, skipped, or a result that does not match).
  returned: success
  type: int
  sample: 2
"""
