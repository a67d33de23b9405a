"""Keep a placement only where it measurably helps: tokens per second asked of the instance's own API before and
after a change, the same prompt and token count each round, medians compared against the rounds' own noise.

Field reports on binding are mixed (2x on dual Xeons, +1.9 % at 98 % local pages, nothing without CPU offload,
intermittently worse), so a change of placement is judged on the host it runs on. Rates come from the server:
llama-server's ``/completion`` says its decode rate (``timings.predicted_per_second``); an OpenAI-compatible server
(vLLM, SGLang, TensorRT-LLM) is timed here, completion tokens over the request's wall time. Every answer is data
until it is a finite positive rate (measure/engine_http: one deadline per request, a size cap, strict JSON): anything
else is a NumaError, and the rollout goes back rather than keep what it could not measure.

The noise model. Before and after cannot be interleaved: a placement is a process's, so the rounds before the
restart all run on the old one and those after on the new. Each set is summarised by its median, and its spread by
the median absolute deviation, scaled to a standard deviation: one slow round (a page fault storm, a neighbour's
burst) moves neither by more than one rank, where half the range of three rounds grows with it without bound. The
band is ``Z`` standard errors of the difference of the two medians, in percent of the median before:

    sigma = MAD_TO_SIGMA * MAD_SMALL_SAMPLE[n] * MAD(rates)    (0 for a single round: no spread to see)
    band  = Z * MEDIAN_SE * sqrt(sigma_before**2 / n_before + sigma_after**2 / n_after) / median_before

clamped to ``FLOOR_PERCENT`` below and the gate's ``max_noise_percent`` above (``capped`` in the verdict): a loss
beyond the cap is rolled back however noisy the rounds were. A set whose own band (the band it would give against
a copy of itself) is wider than the cap is measured again, a round at a time, up to ``max_rounds``. A change is
kept when its gain is not below minus the band, or, with ``min_gain_percent``, when it gains at least that.
bench/gate_noise_bench.py measures the false keeps and rollbacks of this rule against the old one.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import NamedTuple

from . import engine_http
from ..base.engines import ENGINES, GENERIC, LLAMA_CPP_API
from ..base.errors import NumaError, shown
from ..inputs import gate as gate_options

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

    # engine_http.request's shape: (url, seconds, JSON body or None for a GET) -> Answer
    Asker = Callable[[str, float, Optional[Mapping[str, Any]]], engine_http.Answer]
    # What an instance's tokens/s are asked with: ``measure``, or a test's.
    Rates = Callable[["Gate"], List[float]]
    T = TypeVar("T")

# A request's whole answer: a warm-up of a cold server, or a max_tokens of 4096 on a slow CPU, fits well inside it.
REQUEST_SECONDS = 600.0
# The MAD of Gaussian noise is 0.6745 sigma (the normal distribution's third quartile): 1 / 0.6745.
MAD_TO_SIGMA = 1.4826
# The MAD of a few rounds is smaller than that on average: Croux and Rousseeuw's (1992) factors making it unbiased
# for n rounds (n / (n - 0.8) beyond nine), checked by simulation of Gaussian rounds.
MAD_SMALL_SAMPLE = {2: 1.196, 3: 1.495, 4: 1.363, 5: 1.206, 6: 1.200, 7: 1.140, 8: 1.129, 9: 1.107}
# The median of n Gaussian rounds varies by sqrt(pi / 2) sigma / sqrt(n), a little more than a mean does.
MEDIAN_SE = math.sqrt(math.pi / 2)
# Three standard errors: an unchanged rate looks 3 standard errors slower 0.13 % of the time with a known sigma;
# sigma estimated from a few rounds makes it rarer than that (the bench measures it), not far rarer.
Z = 3.0
# Rounds that agree to the last digit (a server at a steady rate) would make the band 0, and a 0.1 % wobble a loss.
FLOOR_PERCENT = 1.0
# A rate an engine reports or we time outside this is no measurement: a token per 1000 s, or ten million a second.
MIN_RATE, MAX_RATE = 1e-3, 1e7
# Completion tokens of one answer; a server claiming more than this is not answering our request.
MAX_TOKENS_ANSWERED = 1e6
# A model id is sent back in each request: a long one is no model's name.
MAX_MODEL_ID_CHARS = 1024


class Gate(NamedTuple):
    """An instance's A/B gate: what to ask, how often, what gain to demand, and how long a request may take."""
    base_url: str  # http://127.0.0.1:PORT
    api: str  # one of base/engines.APIS: "llama.cpp" (/completion) or "openai" (/v1/completions)
    prompt: str
    max_tokens: int
    rounds: int
    min_gain_percent: Optional[float]
    max_rounds: int = gate_options.DEFAULTS["max_rounds"]
    max_noise_percent: float = gate_options.DEFAULTS["max_noise_percent"]
    request_seconds: float = REQUEST_SECONDS


def gate_from(values: Optional[Mapping[str, Any]], port: Optional[int], engine: str,
              request_seconds: float = REQUEST_SECONDS) -> Gate:
    """The Gate of an instance from its converted ``ab_gate`` options (inputs/gate), its port and its engine;
    NumaError naming the first value the gate cannot use."""
    values = gate_options.merged(values)
    found = gate_options.problems(values)
    if found:
        raise NumaError("ab_gate %s" % found[0])
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise NumaError("ab_gate needs the instance's port, not %s: the gate asks the server on it; give the "
                        "service a port (port_base)" % shown(port))
    if isinstance(request_seconds, bool) or not isinstance(request_seconds, (int, float)) or not (
            0 < request_seconds < math.inf):
        raise NumaError("ab_gate: a request's time limit of %s is no positive number of seconds; give one"
                        % shown(request_seconds))
    api = values["api"] if values["api"] != "auto" else ENGINES[engine].api
    return Gate("http://127.0.0.1:%d" % port, api, values["prompt"], values["max_tokens"], values["rounds"],
                values["min_gain_percent"], values["max_rounds"], values["max_noise_percent"], float(request_seconds))


def gated_instances(entries: Sequence[Mapping[str, Any]], request_seconds: float) -> List[Tuple[str, Gate]]:
    """(unit, Gate) of each instance a role gates a host setting's change by (its numa_rollout instances with an
    ``ab_gate``: ``unit``, ``port``, ``engine``; other keys are the rollout's and ignored here). NumaError naming the
    first entry the gate cannot use."""
    found = []
    for entry in entries:
        unit, engine = entry.get("unit"), entry.get("engine") or GENERIC
        if not isinstance(unit, str) or not unit or engine not in ENGINES:
            raise NumaError("gates: each entry needs a unit and an engine of %s, not %s"
                            % (", ".join(sorted(ENGINES)), shown(entry)))
        try:
            found.append((unit, gate_from(entry.get("ab_gate"), entry.get("port"), engine, request_seconds)))
        except NumaError as exc:
            raise NumaError("gates: %s: %s" % (unit, exc)) from None
    return found


def running(gated: Sequence[Tuple[str, Gate]], root: str, run: Callable[[List[str]], Tuple[int, str, str]]
            ) -> List[Tuple[str, Gate]]:
    """Those of ``gated`` whose unit systemd runs (a unit that does not answers no request to measure); under a root
    prefix, which is no running host, all of them."""
    if root not in ("/", ""):
        return list(gated)
    return [(unit, gate) for unit, gate in gated if run(["systemctl", "is-active", "--quiet", "--", unit])[0] == 0]


# ----------------------------------------------------------------- measuring


def measure(gate: Gate, ask: Asker = engine_http.request, clock: Callable[[], float] = time.monotonic) -> List[float]:
    """Tokens per second of ``gate.rounds`` requests (more, up to ``gate.max_rounds``, while their own band is wider
    than ``gate.max_noise_percent``), after one warm-up request left out. NumaError for any answer that is not a
    finite positive rate, each request cut off after ``gate.request_seconds``."""
    ask_round = _round_asker(gate, ask, clock)
    ask_round("the warm-up round")
    count = [0]

    def next_rate() -> float:
        count[0] += 1
        return ask_round("round %d" % count[0])
    return gather(next_rate, gate.rounds, gate.max_rounds, gate.max_noise_percent)


def before_and_after(gated: Sequence[Tuple[str, Gate]], change: Callable[[], T], undo: Callable[[], None],
                     what: str, rates: Rates = measure) -> Tuple[T, Dict[str, Dict[str, Any]], List[str]]:
    """A host setting's change judged as a placement change is: each gated instance (unit, Gate) measured, ``change``
    made, each measured again and judged. (what ``change`` returned, the verdicts by unit, a line per unit the change
    made slower); taking a slower change back is the caller's, which may record why first. NumaError when an instance
    cannot be measured: before the change nothing is changed; after it, ``undo`` takes it back first (``what`` names
    what was put back)."""
    before = {unit: _measured(rates, gate, unit, "before the change; nothing was changed") for unit, gate in gated}
    done = change()
    try:
        after = {unit: _measured(rates, gate, unit, "after the change") for unit, gate in gated}
    except NumaError as exc:
        undo()
        raise NumaError("%s; %s" % (exc, what)) from None
    verdicts = {unit: judge(before[unit], after[unit], gate.min_gain_percent, gate.max_noise_percent)
                for unit, gate in gated}
    slower = ["%s: %s" % (unit, verdict["msg"]) for unit, verdict in sorted(verdicts.items()) if not verdict["kept"]]
    return done, verdicts, slower


def _measured(rates: Rates, gate: Gate, unit: str, when: str) -> List[float]:
    try:
        return rates(gate)
    except NumaError as exc:
        raise NumaError("cannot measure the tokens/s of %s %s: %s" % (unit, when, exc)) from None


def gather(next_rate: Callable[[], float], rounds: int, max_rounds: int, max_noise_percent: float) -> List[float]:
    """``rounds`` rates, and one more at a time while their own band is wider than ``max_noise_percent`` and there
    are fewer than ``max_rounds``."""
    rates = [next_rate() for _round in range(rounds)]
    while len(rates) < max_rounds and own_band_percent(rates) > max_noise_percent:
        rates.append(next_rate())
    return rates


def _round_asker(gate: Gate, ask: Asker, clock: Callable[[], float]) -> Callable[[str], float]:
    """One round's rate, by the gate's api: ``round_name`` -> tokens/s."""
    if gate.api == LLAMA_CPP_API:
        url = gate.base_url + "/completion"
        question = {"prompt": gate.prompt, "n_predict": gate.max_tokens, "ignore_eos": True, "cache_prompt": False}

        def llama_rate(round_name: str) -> float:
            what = "%s (%s)" % (url, round_name)
            timings = _member(_object(ask, url, gate.request_seconds, question, what), "timings", dict, what)
            return engine_http.finite(timings.get("predicted_per_second"), "%s's timings.predicted_per_second" % what,
                                      MIN_RATE, MAX_RATE)
        return llama_rate
    url = gate.base_url + "/v1/completions"
    question = {"model": _model(gate, ask), "prompt": gate.prompt, "max_tokens": gate.max_tokens,
                "ignore_eos": True, "temperature": 0}

    def timed_rate(round_name: str) -> float:
        what = "%s (%s)" % (url, round_name)
        started = clock()
        answer = _object(ask, url, gate.request_seconds, question, what)
        seconds = clock() - started
        usage = _member(answer, "usage", dict, what)
        tokens = engine_http.finite(usage.get("completion_tokens"), "%s's usage.completion_tokens" % what, 1,
                                    MAX_TOKENS_ANSWERED)
        if not tokens.is_integer():
            raise NumaError("%s's usage.completion_tokens is %g, not a count of tokens; %s"
                            % (what, tokens, engine_http.ANSWER_FIX))
        return engine_http.finite(tokens / max(seconds, 1e-9), "the tokens/s of %s, %g tokens in %.3g s"
                                  % (what, tokens, seconds), MIN_RATE, MAX_RATE)
    return timed_rate


def _model(gate: Gate, ask: Asker) -> str:
    """The first model an OpenAI-compatible server lists: the one the gate asks."""
    url = gate.base_url + "/v1/models"
    models = _member(_object(ask, url, gate.request_seconds, None, url), "data", list, url)
    first = models[0] if models else None
    model = first.get("id") if isinstance(first, dict) else None
    if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_ID_CHARS:
        raise NumaError("%s lists no model to ask (data[0].id is %s, not the name of a model); %s"
                        % (url, engine_http.described(model), engine_http.ANSWER_FIX))
    return model


def _object(ask: Asker, url: str, seconds: float, body: Optional[Mapping[str, Any]], what: str) -> Dict[str, Any]:
    """The JSON object ``url`` answers (``what``: the URL and the round, in messages)."""
    return engine_http.answer_object(ask(url, seconds, body), what)


def _member(answer: Mapping[str, Any], key: str, kind: type, what: str) -> Any:
    value = answer.get(key)
    if not isinstance(value, kind):
        wanted = "an object" if kind is dict else "a list"
        raise NumaError("%s answered %s as %s, not %s; %s"
                        % (what, key, engine_http.described(value), wanted, engine_http.ANSWER_FIX))
    return value


# ----------------------------------------------------------------- judging


def robust_sigma(rates: Sequence[float]) -> float:
    """The rounds' standard deviation as their scaled median absolute deviation: one wild round among three or more
    moves it by one rank at most. 0 for a single round."""
    if len(rates) < 2:
        return 0.0
    middle = statistics.median(rates)
    mad = statistics.median([abs(rate - middle) for rate in rates])
    return MAD_TO_SIGMA * MAD_SMALL_SAMPLE.get(len(rates), len(rates) / (len(rates) - 0.8)) * mad


def band_percent(before: Sequence[float], after: Sequence[float]) -> float:
    """Z standard errors of the difference of the two medians, in percent of the median before; unclamped."""
    error = MEDIAN_SE * math.sqrt(robust_sigma(before) ** 2 / len(before) + robust_sigma(after) ** 2 / len(after))
    return 100.0 * Z * error / statistics.median(before)


def own_band_percent(rates: Sequence[float]) -> float:
    """The band a set of rounds would give against another as noisy as itself: what more rounds narrow."""
    return band_percent(rates, rates)


def noise_band(before: Sequence[float], after: Sequence[float], max_noise_percent: float) -> Tuple[float, bool]:
    """(the band in percent: at least FLOOR_PERCENT, at most ``max_noise_percent``; whether the cap cut it). A cap
    below the floor wins: it is the operator's word on the widest band."""
    floored = max(FLOOR_PERCENT, band_percent(before, after))
    return min(floored, max_noise_percent), floored > max_noise_percent


def judge(before: Sequence[float], after: Sequence[float], min_gain_percent: Optional[float],
          max_noise_percent: float = gate_options.DEFAULTS["max_noise_percent"]) -> Dict[str, Any]:
    """The verdict: medians, gain, the noise band, and whether the new placement is kept. NumaError for a rate
    that is no finite positive number, or a threshold that is no finite number in its bounds."""
    _check_rates(before, "before")
    _check_rates(after, "after")
    if min_gain_percent is not None:
        _check_bound("min_gain_percent", min_gain_percent)
    _check_bound("max_noise_percent", max_noise_percent)
    old, new = statistics.median(before), statistics.median(after)
    gain = 100.0 * (new - old) / old
    band, capped = noise_band(before, after, max_noise_percent)
    kept = gain >= min_gain_percent if min_gain_percent is not None else gain >= -band
    need = ("a gain of %.1f %%" % min_gain_percent if min_gain_percent is not None
            else "no loss beyond the noise band of %.1f %%" % band)
    return {"before_tokens_per_second": round(old, 3), "after_tokens_per_second": round(new, 3),
            "gain_percent": round(gain, 2), "noise_percent": round(band, 2), "capped": capped,
            "rounds": len(after), "rounds_before": len(before), "kept": kept,
            "msg": "%.2f -> %.2f tokens/s (%+.1f %%, noise %.1f %%%s): %s, needed %s"
                   % (old, new, gain, band, ", capped" if capped else "", "kept" if kept else "rolled back", need)}


def _check_rates(rates: Sequence[float], which: str) -> None:
    if not rates:
        raise NumaError("no tokens/s measured %s the change; measure at least one round" % which)
    for rate in rates:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not MIN_RATE <= rate <= MAX_RATE:
            raise NumaError("a rate measured %s the change is %s, not a tokens/s from %g to %g; the gate judges "
                            "only measured rates" % (which, engine_http.described(rate), MIN_RATE, MAX_RATE))


def _check_bound(name: str, value: float) -> None:
    found = gate_options.problems({name: value}) if value is not None else [
        "%s: give a number" % name]
    if found:
        raise NumaError("ab_gate %s" % found[0])
