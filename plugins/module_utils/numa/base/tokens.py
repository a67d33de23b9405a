"""The server's command from a plan: ``{threads}``-style tokens filled, the engine's arguments added; a
service's traffic hooks (drain, undrain) filled by the same rule from their own tokens.

numa-pin does it at every start (wrapper mode), the inference_service role
at deploy time (systemd mode); both call server_command. The names of numa-pin's own
environment, which the role's units set and numa-pin reads, live here too.
"""
from __future__ import annotations

from .errors import NumaError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, List, Mapping, Optional, Sequence, Tuple

TOKENS = ("threads", "node", "cpulist", "instance", "port")
# A traffic hook's tokens (the inference_service role's drain_command, undrain_command): an instance as a load
# balancer names it, not its placement, which a hook has no use for.
HOOK_TOKENS = ("service", "unit", "instance", "port")
# What reads as a token: a word in braces. JSON in an argument ({"state": "drain"}) is not one.
_TOKEN = r"\{([A-Za-z_][A-Za-z0-9_]*)\}"
# numa-pin's own environment, which a service's environment may not set.
OWN_ENV_PREFIX = "INFEROPS_NUMA_"
# =unbound: numa-pin exec leaves the affinity and memory policy at the Linux default, for the A/B gate's baseline.
BASELINE_ENV = OWN_ENV_PREFIX + "AB_BASELINE"


def server_command(argv: Sequence[str], plan: Mapping[str, Any], container: Optional[str] = None,
                   bound: bool = True) -> Tuple[List[str], List[str]]:
    """(the server's argv: the tokens filled from the plan, then the engine recipe's arguments, and for a
    ``container`` runtime's ``run`` command the plan's flags after ``run`` (no cpuset when not ``bound``); the
    recipe's flags the command already gave). numa-pin exec and the role's systemd mode share it."""
    from .engines import with_engine_args

    argv, kept = with_engine_args(substitute_tokens(argv, plan), (plan.get("engine") or {}).get("args") or [])
    if container:
        from .containers import with_plan_flags

        argv = with_plan_flags(argv, container, plan, bound)
    return argv, kept


def substitute_tokens(argv: Sequence[str], plan: Mapping[str, Any], names: Sequence[str] = TOKENS) -> List[str]:
    """Replace ``{threads}`` ``{node}`` ``{cpulist}`` ``{instance}`` ``{port}`` (or the tokens ``names``) from a
    plan dict (or a hook's values).

    Only these exact tokens are replaced (no ``str.format``), so other braces in
    an argument, like a JSON value, pass through untouched.
    """
    values = dict((token, str(plan[token])) for token in names if plan.get(token) is not None)
    result = []
    for arg in argv:
        if not isinstance(arg, str):
            raise NumaError("argument %r is not a string: write every argument of the command as text" % (arg,))
        for token in names:
            marker = "{%s}" % token
            if marker in arg:
                if token not in values:
                    raise NumaError("argument %r uses %s but the plan has no %s: %s"
                                    % (arg, marker, token, _missing_token_fix(token)))
                arg = arg.replace(marker, values[token])
        result.append(arg)
    return result


def unknown_tokens(argv: Sequence[str], names: Sequence[str] = HOOK_TOKENS) -> List[str]:
    """The ``{word}`` tokens of ``argv`` that are none of ``names``, in order, each once: a hook's typo
    (``{unti}``) would otherwise reach the load balancer as it is."""
    import re  # here, not at the top: numa-pin exec imports this module at every start and has no use for re

    found = []  # type: List[str]
    for arg in argv:
        for word in re.findall(_TOKEN, arg):
            if word not in names and "{%s}" % word not in found:
                found.append("{%s}" % word)
    return found


def _missing_token_fix(token: str) -> str:
    if token == "port":
        return "set port_base on the service (numa-pin: --port-base N; instance i listens on N + i)"
    return "check the plan with `numa-pin explain`"
