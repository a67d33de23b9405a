"""Keep a placement only where it measurably helps: tokens per second asked of the instance's own API before and
after a change, the same prompt and token count each round, medians compared against the rounds' own noise.

Field reports on binding are mixed (2x on dual Xeons, +1.9 % at 98 % local pages, nothing without CPU offload,
intermittently worse), so a change of placement is judged on the host it runs on. Rates come from the server:
llama-server's ``/completion`` says its decode rate (``timings.predicted_per_second``); an OpenAI-compatible server
(vLLM, SGLang, TensorRT-LLM) is timed here, completion tokens over the request's wall time.

The noise band is half the spread of a set of rounds relative to its median, the wider of before and after: a
change is kept when it is not slower than that band (or, with ``min_gain_percent``, gains at least that much).
"""

import json
import statistics
import time
from http import client as http_client
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional
from urllib.parse import urlsplit

from ..base.errors import NumaError

REQUEST_TIMEOUT_SECONDS = 600.0


class Gate(NamedTuple):
    """An instance's A/B gate: what to ask, how often, and what gain to demand."""
    base_url: str  # http://127.0.0.1:PORT
    api: str  # "llama.cpp" (/completion) or "openai" (/v1/completions)
    prompt: str
    max_tokens: int
    rounds: int
    min_gain_percent: Optional[float]


Asker = Callable[[str, str, Mapping[str, Any]], Dict[str, Any]]  # (base_url, path, body) -> parsed JSON


def post_json(base_url: str, path: str, body: Mapping[str, Any]) -> Dict[str, Any]:
    parts = urlsplit(base_url)
    connection = http_client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=REQUEST_TIMEOUT_SECONDS)
    try:
        connection.request("POST" if body else "GET", path, json.dumps(body) if body else None,
                           {"Content-Type": "application/json"})
        answer = connection.getresponse()
        text = answer.read(1 << 20)
        if answer.status != 200:
            raise NumaError("%s%s answered %d: %s" % (base_url, path, answer.status, text[:200]))
    except (OSError, http_client.HTTPException) as exc:
        raise NumaError("%s%s: %s" % (base_url, path, exc))
    finally:
        connection.close()
    try:
        return json.loads(text)
    except ValueError:
        raise NumaError("%s%s answered no JSON: %r" % (base_url, path, text[:200]))


def measure(gate: Gate, ask: Asker = post_json, clock: Callable[[], float] = time.monotonic) -> List[float]:
    """Tokens per second of ``gate.rounds`` requests, after one warm-up request left out."""
    model = _model(gate, ask) if gate.api == "openai" else None
    rates = []
    for round_number in range(gate.rounds + 1):
        started = clock()
        if gate.api == "llama.cpp":
            answer = ask(gate.base_url, "/completion", {"prompt": gate.prompt, "n_predict": gate.max_tokens,
                                                        "ignore_eos": True, "cache_prompt": False})
            rate = float((answer.get("timings") or {}).get("predicted_per_second") or 0.0)
        else:
            answer = ask(gate.base_url, "/v1/completions", {"model": model, "prompt": gate.prompt,
                                                            "max_tokens": gate.max_tokens, "ignore_eos": True,
                                                            "temperature": 0})
            tokens = int((answer.get("usage") or {}).get("completion_tokens") or 0)
            rate = tokens / max(clock() - started, 1e-9)
        if rate <= 0:
            raise NumaError("%s gave no token rate: %s" % (gate.base_url, json.dumps(answer)[:200]))
        if round_number:
            rates.append(rate)
    return rates


def _model(gate: Gate, ask: Asker) -> str:
    models = ask(gate.base_url, "/v1/models", {}).get("data") or []
    if not models or not isinstance(models[0], dict) or not models[0].get("id"):
        raise NumaError("%s/v1/models lists no model to ask" % gate.base_url)
    return str(models[0]["id"])


def noise_percent(rates: List[float]) -> float:
    """Half the spread of the rounds, in percent of their median."""
    return 50.0 * (max(rates) - min(rates)) / statistics.median(rates)


def judge(before: List[float], after: List[float], min_gain_percent: Optional[float]) -> Dict[str, Any]:
    """The verdict: medians, gain, the noise band, and whether the new placement is kept."""
    old, new = statistics.median(before), statistics.median(after)
    gain = 100.0 * (new - old) / old
    band = max(noise_percent(before), noise_percent(after))
    kept = gain >= min_gain_percent if min_gain_percent is not None else gain >= -band
    need = ("a gain of %.1f %%" % min_gain_percent if min_gain_percent is not None
            else "no loss beyond the noise band of %.1f %%" % band)
    return {"before_tokens_per_second": round(old, 3), "after_tokens_per_second": round(new, 3),
            "gain_percent": round(gain, 2), "noise_percent": round(band, 2), "rounds": len(after),
            "kept": kept, "msg": "%.2f -> %.2f tokens/s (%+.1f %%, noise %.1f %%): %s, needed %s"
                                 % (old, new, gain, band, "kept" if kept else "rolled back", need)}
