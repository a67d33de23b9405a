"""How an A/B gate measures a placement change: each option declared once, with the bounds it must keep.

``OPTIONS`` holds the name, type, default, choices and bounds of a service's ``ab_gate`` keys; numa_rollout's
argument spec (``argument_spec``), the preflight's check of every entry (``problems``) and measure/ab_gate's
``Gate`` are built from it, so a value the gate would refuse after a restart is refused before any host is
changed. NaN and the infinities are refused everywhere: NaN compares false, so a NaN threshold would roll back
every change and an infinite one would keep every loss.

Pure: no I/O.
"""

from __future__ import annotations

from ..base.engines import APIS
from ..base.errors import shown
from ..base.sizes import finite_number
from .request import Option

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Tuple

# A prompt is sent as it is in every round; far longer ones measure the prompt's pass, not the decode rate.
MAX_PROMPT_CHARS = 4096
OPTIONS = (
    Option("rounds", "int", "measured requests before and after the change, besides one warm-up each", default=5),
    Option("max_rounds", "int", "the rounds may grow to this many while their spread is too wide to judge",
           default=15),
    Option("prompt", "str", "the prompt of every request", default="Hello"),
    Option("max_tokens", "int", "tokens generated per request (ignore_eos: each round generates them all)",
           default=16),
    Option("min_gain_percent", "float", "keep the change only with at least this gain; default: keep it unless "
                                        "slower than the noise band"),
    Option("max_noise_percent", "float", "the widest the noise band may be: a loss beyond it is rolled back however "
                                         "noisy the rounds were", default=5.0),
    Option("api", "str", "llama.cpp (/completion, the server's decode rate), openai (/v1/completions, timed) or "
                         "auto (by the engine)", default="auto", choices=("auto",) + APIS),
)
DEFAULTS = {option.name: option.default for option in OPTIONS}
# (lowest, highest) of each number.
BOUNDS = {
    "rounds": (1, 50),
    "max_rounds": (1, 200),
    "max_tokens": (1, 4096),
    "min_gain_percent": (-100.0, 1000.0),
    "max_noise_percent": (0.5, 50.0),
}  # type: Dict[str, Tuple[float, float]]


def argument_spec() -> Dict[str, Dict[str, Any]]:
    """An ab_gate's suboptions as an Ansible argument spec (numa_rollout's, the role entry's preflight)."""
    spec = {}  # type: Dict[str, Dict[str, Any]]
    for option in OPTIONS:
        entry = {"type": option.kind}  # type: Dict[str, Any]
        if option.default is not None:
            entry["default"] = option.default
        if option.choices:
            entry["choices"] = list(option.choices)
        spec[option.name] = entry
    # max_tokens is a token count, not a secret (validate-modules reads "token" as one).
    spec["max_tokens"]["no_log"] = False
    return spec


def problems(values: Mapping[str, Any]) -> List[str]:
    """"key: cause; fix" for each value of a converted ab_gate (argument_spec's types) the gate cannot use."""
    found = []
    for name, (low, high) in BOUNDS.items():
        value = values.get(name)
        if value is None:
            continue
        if not finite_number(value) or not low <= value <= high:
            found.append("%s: %s is not a number from %s to %s; give one in that range"
                         % (name, shown(value), _number(low), _number(high)))
    rounds, most = values.get("rounds"), values.get("max_rounds")
    if not found and rounds is not None and most is not None and most < rounds:
        found.append("max_rounds: %d is fewer than rounds (%d); give max_rounds of at least rounds" % (most, rounds))
    prompt = values.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or not 0 < len(prompt) <= MAX_PROMPT_CHARS):
        found.append("prompt: give a text of 1 to %d characters" % MAX_PROMPT_CHARS)
    return found


def merged(values: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """An ab_gate's values over the defaults (keys left out, or given as null, take theirs)."""
    given = {key: value for key, value in (values or {}).items() if value is not None}
    return dict(DEFAULTS, **given)


def _number(value: float) -> str:
    return "%g" % value
