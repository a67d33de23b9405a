#!/usr/bin/env python3
"""How often the A/B gate keeps a regression or rolls back a change that did nothing: the old rule against the
noise model of measure/ab_gate.py, on simulated rates.

    .venv/bin/python bench/gate_noise_bench.py [--trials N] [--seed S]

Each trial measures an instance at a true rate of 10 tokens/s before a change and at 10 x (1 + change) after it,
every round off by Gaussian noise of sigma 1 % or 3 % of the rate; with an outlier, one round (a random one, of the
set before or after, chosen at random) runs at 60 % of its rate instead (a page-fault storm, a neighbour's burst).
Changes of +0 % (a neutral placement), -10 % and -30 % (regressions) and +10 % (a gain).

  old: 3 rounds each; the band is half the spread (max - min) over the median, the wider of the two sets; kept when
       the gain is not below minus the band;
  new: ab_gate.gather (5 rounds, one more at a time up to 15 while a set's own band is wider than the 5 % cap) and
       ab_gate.judge (median and scaled MAD, 3 standard errors of the difference of medians, 1 % floor, 5 % cap).

Printed: the share of trials each rule keeps, for each case; then the false keeps (a regression kept) and the false
rollbacks (a +0 % change rolled back), old and new, and their ratio. Goal: the -10 % and -30 % regressions with an
outlier round detected (false keeps near 0), the +0 % change kept (false rollbacks low). Pure computation: the
figures depend on the seed, not on the machine.
"""

import argparse
import os
import random
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "build"))
sys.path.insert(0, REPO)

from tests import conftest  # noqa: E402,F401  (creates build/ansible_collections/inferops/numa)

from ansible_collections.inferops.numa.plugins.module_utils.numa.measure import ab_gate  # noqa: E402
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import gate as gate_options  # noqa: E402

TRUE_RATE = 10.0
SIGMAS = (0.01, 0.03)
CHANGES = (0.0, -0.10, -0.30, 0.10)
OUTLIER_SHARE = 0.6
OLD_ROUNDS = 3
ROUNDS, MAX_ROUNDS, CAP = (gate_options.DEFAULTS[name] for name in ("rounds", "max_rounds", "max_noise_percent"))


def old_kept(before, after):
    """The rule this replaced: half max - min over the median, the wider set's; kept unless slower than that."""
    band = max(50.0 * (max(rates) - min(rates)) / statistics.median(rates) for rates in (before, after))
    gain = 100.0 * (statistics.median(after) - statistics.median(before)) / statistics.median(before)
    return gain >= -band


def new_kept(before, after):
    return ab_gate.judge(before, after, None, CAP)["kept"]


def rate_source(rng, rate, sigma, outlier_round):
    """The rates of one set's rounds, in order: Gaussian noise, one round at OUTLIER_SHARE where asked."""
    count = [0]

    def next_rate():
        count[0] += 1
        if count[0] - 1 == outlier_round:
            return rate * OUTLIER_SHARE
        return max(ab_gate.MIN_RATE, rate * (1 + rng.gauss(0.0, sigma)))
    return next_rate


def trial(rng, sigma, change, outlier):
    """(old rule keeps, new judge keeps, rounds the new one measured per set) of one simulated change."""
    after_rate = TRUE_RATE * (1 + change)
    where = rng.choice(("before", "after")) if outlier else None
    old_round, new_round = rng.randrange(OLD_ROUNDS), rng.randrange(ROUNDS)
    old = old_kept(_rounds(rng, TRUE_RATE, sigma, old_round if where == "before" else -1),
                   _rounds(rng, after_rate, sigma, old_round if where == "after" else -1))
    before = ab_gate.gather(rate_source(rng, TRUE_RATE, sigma, new_round if where == "before" else -1),
                            ROUNDS, MAX_ROUNDS, CAP)
    after = ab_gate.gather(rate_source(rng, after_rate, sigma, new_round if where == "after" else -1),
                           ROUNDS, MAX_ROUNDS, CAP)
    return old, new_kept(before, after), (len(before) + len(after)) / 2.0


def _rounds(rng, rate, sigma, outlier_round):
    next_rate = rate_source(rng, rate, sigma, outlier_round)
    return [next_rate() for _ in range(OLD_ROUNDS)]


def run(trials, seed):
    """{(sigma, outlier, change): (old kept share, new kept share, new mean rounds per set)}."""
    rng = random.Random(seed)
    found = {}
    for sigma in SIGMAS:
        for outlier in (False, True):
            for change in CHANGES:
                outcomes = [trial(rng, sigma, change, outlier) for _ in range(trials)]
                found[sigma, outlier, change] = tuple(statistics.mean(column) for column in zip(*outcomes))
    return found


def wrong_share(change, kept):
    """The share of trials the verdict was wrong: a loss kept, or a change that is no loss rolled back."""
    return kept if change < 0 else 1.0 - kept


def ratio(new, old):
    if not old:
        return "- (both 0)" if not new else "- (old 0)"
    return "%.3f" % (new / old)


def report(found, trials, seed):
    print("A/B gate verdicts on simulated rates: %d trials per case, seed %d; true rate %.0f tokens/s, an outlier "
          "round at %d %% of its rate" % (trials, seed, TRUE_RATE, OUTLIER_SHARE * 100))
    print("new judge: %d rounds, up to %d while a set's own band > %.0f %%; Z %.1f, floor %.0f %%, cap %.0f %%"
          % (ROUNDS, MAX_ROUNDS, CAP, ab_gate.Z, ab_gate.FLOOR_PERCENT, CAP))
    print("\n  %-6s %-8s %7s | %-9s %-9s | %-9s %-9s | %-6s | %s"
          % ("noise", "outlier", "change", "old kept", "new kept", "old wrong", "new wrong", "rounds", "new/old wrong"))
    for (sigma, outlier, change), (old, new, rounds) in sorted(found.items()):
        old_wrong, new_wrong = wrong_share(change, old), wrong_share(change, new)
        print("  %4.0f %%  %-8s %+5.0f %% | %7.2f %%  %7.2f %% | %7.2f %%  %7.2f %% | %6.1f | %s"
              % (sigma * 100, "one" if outlier else "none", change * 100, old * 100, new * 100, old_wrong * 100,
                 new_wrong * 100, rounds, ratio(new_wrong, old_wrong)))
    print("\n  summary (old -> new, and new / old):")
    for name, changes in (("false keeps of the -10 % and -30 % regressions", (-0.10, -0.30)),
                          ("false rollbacks of the +0 % change", (0.0,)),
                          ("false rollbacks of the +10 % gain", (0.10,))):
        for outlier in (False, True):
            cases = [(found[sigma, outlier, change], change) for sigma in SIGMAS for change in changes]
            old = statistics.mean(wrong_share(change, row[0]) for row, change in cases)
            new = statistics.mean(wrong_share(change, row[1]) for row, change in cases)
            print("    %-50s %-15s %6.2f %% -> %6.2f %%  ratio %s" % (
                name, "(one outlier)" if outlier else "(no outlier)", old * 100, new * 100, ratio(new, old)))
    worst_keep = max(wrong_share(change, row[1]) for (sigma, outlier, change), row in found.items() if change < 0)
    worst_rollback = max(wrong_share(0.0, row[1]) for (sigma, outlier, change), row in found.items() if change == 0)
    print("\n  goal: regressions of 10 %% and 30 %% detected with an outlier round (false keeps near 0: worst case "
          "%.2f %%); a +0 %% change kept (false rollbacks low: worst case %.2f %%)" % (worst_keep * 100,
                                                                                      worst_rollback * 100))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=4000, help="simulated changes per case")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    report(run(args.trials, args.seed), args.trials, args.seed)


if __name__ == "__main__":
    main()
