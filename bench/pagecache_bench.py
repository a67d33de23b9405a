"""The page-cache look of `numa-pin exec --model` on a fully cached model file.

    .venv/bin/python bench/pagecache_bench.py [--runs N] [--size-mib N] [--dir DIR]

Writes a file of real data (a sparse file has no pages to cache), reads it back so
that every page is cached, and times the look as exec does it (sample_residency), the
same with cachestat(2) unavailable (mincore only: kernels before 6.5, or a seccomp
filter without it), and evict_remote, which looks at every page (what exec ran
before). Then the whole command `numa-pin exec --node 0 --model FILE -- /bin/true`
against `--page-cache ignore` and no --model. Prints ms, the ratio to the 25 ms goal
and the estimate's difference from the full scan in percentage points. The host may
drop page cache at any time: the file is read again before every timed run. The file
is removed at the end.
"""

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

from timing import PACKAGE_PARENT, install_helper, report, time_command

sys.path.insert(0, PACKAGE_PARENT)
from numa.act import pagecache  # noqa: E402  (the package is found through PACKAGE_PARENT)

GOAL_MS = 25.0
CHUNK = 8 << 20


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--dir", default="/var/tmp", help="where the model file is written (a disk file system)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pagecache-bench-", dir=args.dir) as scratch:
        model = os.path.join(scratch, "model.gguf")
        write_model(model, args.size_mib << 20)
        looks = time_looks(model, args.runs)
        commands = time_commands(model, scratch, args.runs)
        accuracy = compare_with_full_scan(model)
    print("\n== page-cache look of a cached %d MiB model (%d pages), in-process, %d runs"
          % (args.size_mib, accuracy["pages"], args.runs))
    for name, (best, median) in looks:
        print("  %-58s best %7.1f ms  median %7.1f ms  goal ratio %.2f" % (name, best * 1e3, median * 1e3,
                                                                          median * 1e3 / GOAL_MS))
    print("  goal: the look <= %g ms for a cached 1 GiB model" % GOAL_MS)
    report("numa-pin exec with the model cached", commands, "exec --node 0 -- /bin/true (no --model)",
           "the look adds <= %g ms to the command" % GOAL_MS)
    print("\n== estimate vs every page looked at")
    print("  sampled: %s" % accuracy["estimate"])
    print("  cached pages: sampled look %d, full scan %d: %.2f pp of the file apart"
          % (accuracy["sampled_cached"], accuracy["full_cached"], accuracy["cached_pp"]))
    print("  largest node share difference: %.2f pp (bound %g pp)" % (accuracy["node_pp"], pagecache.BOUND_PP))
    worst, bound = made_up_two_node_error(accuracy["pages"])
    print("  made-up 2-node map, pages spread 50/50 at random (this host has one node), 20 draws: "
          "largest error %.2f pp (bound %g pp)" % (worst, bound))


def write_model(path, size):
    block = os.urandom(CHUNK)
    with open(path, "wb") as handle:
        for _ in range(size // CHUNK):
            handle.write(block)
        handle.write(block[:size % CHUNK])
        handle.flush()
        os.fsync(handle.fileno())  # no writeback running under the timings


def warm(path):
    """Read the file until every page of it is cached."""
    for _ in range(5):
        with open(path, "rb", buffering=0) as handle:
            while handle.read(CHUNK):
                pass
        look = pagecache.sample_residency(path)
        if look["cached_pages"] == look["pages"]:
            return
    raise SystemExit("%s does not stay cached (memory pressure?): free memory and run again" % path)


def timed(function, runs, path):
    samples = []
    for _ in range(runs):
        warm(path)
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return min(samples), statistics.median(samples)


def time_looks(model, runs):
    sampled = timed(lambda: pagecache.sample_residency(model), runs, model)
    real_cachestat = pagecache._cachestat
    pagecache._cachestat = lambda fd, offset, length: None
    try:
        mincore_only = timed(lambda: pagecache.sample_residency(model), runs, model)
    finally:
        pagecache._cachestat = real_cachestat
    full = timed(lambda: pagecache.evict_remote(model, [0]), max(3, runs // 3), model)
    return [("sample_residency (exec's look now)", sampled),
            ("sample_residency, mincore only (no cachestat)", mincore_only),
            ("evict_remote: every page (exec's look before)", full)]


def time_commands(model, scratch, runs):
    launcher = install_helper(os.path.join(scratch, "helper"))
    base = [launcher, "exec", "--node", "0"]
    variants = [
        ("exec --node 0 -- /bin/true (no --model)", base),
        ("exec --node 0 --model FILE --page-cache ignore -- /bin/true",
         base + ["--model", model, "--page-cache", "ignore"]),
        ("exec --node 0 --model FILE -- /bin/true (the look)", base + ["--model", model]),
    ]
    samples = {name: [] for name, _argv in variants}
    for _ in range(runs):  # round robin: a change in the machine's load hits every variant alike
        for name, argv in variants:
            warm(model)
            samples[name].append(time_command(argv + ["--", "/bin/true"], 1)[0])
    return [(name, (min(samples[name]), statistics.median(samples[name]))) for name, _argv in variants]


def compare_with_full_scan(model):
    warm(model)
    sample = pagecache.sample_residency(model)
    full = pagecache.file_residency(model)
    shares = {node: 100.0 * count / full["cached_pages"] for node, count in full["nodes"].items()}
    node_pp = max(abs(sample["node_percent"].get(node, 0.0) - shares.get(node, 0.0))
                  for node in set(shares) | set(sample["node_percent"]))
    return {"pages": full["pages"], "estimate": sample["estimate"], "sampled_cached": sample["cached_pages"],
            "full_cached": full["cached_pages"], "node_pp": node_pp,
            "cached_pp": 100.0 * abs(sample["cached_pages"] - full["cached_pages"]) / full["pages"]}


def made_up_two_node_error(pages):
    rng = random.Random(1)
    nodes = [rng.randrange(2) for _ in range(pages)]
    exact = nodes.count(1) / pages
    worst = 0.0
    for seed in range(20):
        estimate = pagecache.estimate_nodes(pages, lambda ranks: [nodes[rank] for rank in ranks],
                                            random.Random(seed).randbytes)
        worst = max(worst, 100 * abs(estimate["nodes"].get(1, 0.0) - exact))
    return worst, estimate["bound_pp"]


if __name__ == "__main__":
    main()
