"""``{threads}``-style tokens in a server's argv, filled from a plan.

numa-pin fills them at every start (wrapper mode), the inference_service role
at deploy time (systemd mode); both call this one function.
"""
from __future__ import annotations

from .errors import NumaError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, List, Mapping, Sequence

TOKENS = ("threads", "node", "cpulist", "instance", "port")


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
