# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The untouched_hosts callback: when a run stops before a rollout play reached every host, one line after the
recap says which hosts were left untouched and why.

Why a callback and not a rescue in the play: a host that is unreachable runs no rescue, and the run that stops at
site.yml's preflight (any_errors_fatal, one host failed or unreachable) never enters the play that changes hosts; a
callback sees every batch, every lost host and the end of the run, whichever play stopped it.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: untouched_hosts
type: aggregate
short_description: Say which hosts a stopped run left untouched, and why
version_added: "1.0.0"
description:
  - >-
    When a run stops before a rollout play reached all of its hosts, prints one line after the play recap: the
    hosts of the play's later batches that never ran a task of it, the hosts that failed or were unreachable in the
    batch where the run stopped, and the rule that stopped it (C(any_errors_fatal), C(max_fail_percentage N), or
    C(whole batch lost) when no host of that batch was left, as when the only canary host is unreachable).
  - "For example, after a failed canary: inferops.numa: stopped after llm-01 failed (max_fail_percentage 0): left
    untouched: llm-02, llm-03"
  - >-
    A rollout play is one whose play variable C(inferops_numa_rollout) is true: the play of C(inferops.numa.site)
    that runs the numa_host and inference_service roles batch by batch. A run stopped before that play started (by
    site's preflight, which stops every host when one fails or is unreachable) leaves all its hosts untouched.
  - Prints nothing when every host of every rollout play was reached, whether or not some failed.
  - >-
    Ansible loads a collection's callback only when asked: the collection's checkout enables it in its
    C(ansible.cfg); elsewhere add C(callbacks_enabled = inferops.numa.untouched_hosts) to the C([defaults]) of your
    C(ansible.cfg), or set C(ANSIBLE_CALLBACKS_ENABLED=inferops.numa.untouched_hosts).
requirements:
  - enabled in ansible.cfg (callbacks_enabled) or ANSIBLE_CALLBACKS_ENABLED
"""

from ansible import constants as C
from ansible.plugins.callback import CallbackBase

MARKER = "inferops_numa_rollout"
PREFIX = "inferops.numa"


class _PlayRun:
    """What one play did: its hosts (after --limit), those a task of it started on, and its current batch with the
    hosts lost in it."""

    __slots__ = ("play", "hosts", "reached", "batch", "lost")

    def __init__(self, play, hosts):
        self.play = play
        self.hosts = hosts
        self.reached = set()
        self.batch = []
        self.lost = {}  # host -> "failed" | "unreachable", in the order they were lost


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "inferops.numa.untouched_hosts"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None):
        super().__init__(display=display)
        self._plays = []
        self._runs = {}
        self._current = None
        self._stopped_by = None

    # --- what happened --------------------------------------------------------------------------------------

    def v2_playbook_on_start(self, playbook):
        self._plays, self._runs, self._current, self._stopped_by = [], {}, None, None
        try:
            self._plays = list(playbook.get_plays())
        except Exception:  # a callback never breaks the run it reports on
            self._plays = []

    def v2_playbook_on_play_start(self, play):
        """Sent for every batch of a play (each with a copy of the play, the inventory restricted to the batch), and
        for the plays after one that any_errors_fatal stopped, where no host runs anything."""
        run = self._runs.get(play._uuid)
        if run is None:
            run = self._runs[play._uuid] = _PlayRun(play, _hosts(play, batch=False))
        run.play = play  # the copy is post-validated: its max_fail_percentage is a number
        run.batch = _hosts(play, batch=True)
        run.lost = {}
        self._current = run

    def v2_runner_on_start(self, host, task):
        if self._current is not None:
            self._current.reached.add(host.get_name())

    def v2_runner_on_failed(self, result, ignore_errors=False):
        if not ignore_errors:
            self._lose(result, "failed")

    def v2_runner_on_unreachable(self, result):
        self._lose(result, "unreachable")

    def _lose(self, result, how):
        host = getattr(result, "host", None) or getattr(result, "_host", None)
        if self._current is not None and host is not None:
            self._current.lost.setdefault(host.get_name(), how)
            self._stopped_by = self._current

    # --- the line ---------------------------------------------------------------------------------------------

    def v2_playbook_on_stats(self, stats):
        try:
            line = self.line(stats)
        except Exception as exc:  # say so, never fail the run over its summary
            line = "%s: could not tell which hosts were left untouched (%s)" % (PREFIX, exc)
        if line:
            self._display.display(line, color=C.COLOR_ERROR)

    def line(self, stats):
        """The line for this run, or None when every host of every rollout play was reached (or no host was lost:
        a play whose tasks --tags left out reached no host and was not stopped)."""
        untouched = []
        for play in self._plays:
            if not _is_rollout(play):
                continue
            run = self._runs.get(play._uuid)
            hosts = run.hosts if run is not None else _hosts(play, batch=False)
            reached = run.reached if run is not None else set()
            untouched += [host for host in hosts if host not in reached and host not in untouched]
        if not untouched or not (any(stats.failures.values()) or any(stats.dark.values())):
            return None
        return "%s: stopped%s: left untouched: %s" % (PREFIX, self._why(stats), ", ".join(untouched))

    def _why(self, stats):
        run = self._stopped_by
        lost = {host: how for host, how in (run.lost if run is not None else {}).items()
                if (stats.failures if how == "failed" else stats.dark).get(host)}
        if not lost:
            return ""
        failed = [host for host, how in lost.items() if how == "failed"]
        unreachable = [host for host, how in lost.items() if how == "unreachable"]
        parts = []
        if failed:
            parts.append("%s failed" % _names(failed))
        if unreachable:
            parts.append("%s %s unreachable" % (_names(unreachable), "was" if len(unreachable) == 1 else "were"))
        return " after %s%s" % (" and ".join(parts), _rule(run, failed, lost))


def _rule(run, failed, lost):
    """The rule that stopped the run at this batch, as Ansible applies them (linear strategy, playbook executor)."""
    play = run.play
    if play.any_errors_fatal:
        return " (any_errors_fatal)"
    percentage = play.max_fail_percentage
    if percentage is not None and run.batch and len(failed) / float(len(run.batch)) > float(percentage) / 100.0:
        return " (max_fail_percentage %s)" % ("%g" % float(percentage))
    if len(lost) >= len(run.batch):
        return " (whole batch lost)"
    return ""


def _is_rollout(play):
    value = (getattr(play, "vars", None) or {}).get(MARKER)
    return value is True or str(value).lower() in ("true", "yes", "1")


def _hosts(play, batch):
    """The play's hosts in the order its batches take them: all of them (after --limit), or the current batch's."""
    manager = play.get_variable_manager()
    inventory = getattr(manager, "_inventory", None)
    pattern = play.hosts
    if inventory is None or (isinstance(pattern, str) and "{{" in pattern):
        return []
    found = inventory.get_hosts(pattern, ignore_restrictions=not batch, order=play.order)
    return [host.get_name() for host in found]


def _names(hosts):
    """llm-01 | llm-01 and llm-02 | llm-01, llm-02 and llm-03."""
    return hosts[0] if len(hosts) == 1 else "%s and %s" % (", ".join(hosts[:-1]), hosts[-1])
