"""The server's command from a plan: ``{threads}``-style tokens filled, the engine's arguments added.

numa-pin does it at every start (wrapper mode), the inference_service role
at deploy time (systemd mode); both call server_command. The names of numa-pin's own
environment, which the role's units set and numa-pin reads, live here too.
"""
from __future__ import annotations

from .errors import NumaError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, List, Mapping, Sequence, Tuple

TOKENS = ("threads", "node", "cpulist", "instance", "port")
# numa-pin's own environment, which a service's environment may not set.
OWN_ENV_PREFIX = "INFEROPS_NUMA_"
# =unbound: numa-pin exec leaves the affinity and memory policy at the Linux default, for the A/B gate's baseline.
BASELINE_ENV = OWN_ENV_PREFIX + "AB_BASELINE"


def server_command(argv: Sequence[str], plan: Mapping[str, Any]) -> Tuple[List[str], List[str]]:
    """(the server's argv: the tokens filled from the plan, then the engine recipe's arguments; the
    recipe's flags the command already gave). numa-pin exec and the role's systemd mode share it."""
    from .engines import with_engine_args

    return with_engine_args(substitute_tokens(argv, plan), (plan.get("engine") or {}).get("args") or [])


def substitute_tokens(argv: Sequence[str], plan: Mapping[str, Any]) -> List[str]:
    """Replace ``{threads}`` ``{node}`` ``{cpulist}`` ``{instance}`` ``{port}`` from a plan dict.

    Only these exact tokens are replaced (no ``str.format``), so other braces in
    an argument, like a JSON value, pass through untouched.
    """
    values = dict((token, str(plan[token])) for token in TOKENS if plan.get(token) is not None)
    result = []
    for arg in argv:
        if not isinstance(arg, str):
            raise NumaError("argument %r is not a string: write every argument of the command as text" % (arg,))
        for token in TOKENS:
            marker = "{%s}" % token
            if marker in arg:
                if token not in values:
                    raise NumaError("argument %r uses %s but the plan has no %s: %s"
                                    % (arg, marker, token, _missing_token_fix(token)))
                arg = arg.replace(marker, values[token])
        result.append(arg)
    return result


def _missing_token_fix(token: str) -> str:
    if token == "port":
        return "set port_base on the service (numa-pin: --port-base N; instance i listens on N + i)"
    return "check the plan with `numa-pin explain`"
