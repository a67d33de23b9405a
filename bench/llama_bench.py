"""Issue 7 benchmark: the real llama-server on this host, pinned by numa-pin vs unpinned.

    .venv/bin/python bench/llama_bench.py [--rounds N] [--size-mb MB] [--tokens N]

Builds (or reuses) llama-server and a random-weight model of --size-mb MiB (both cached in
~/.cache/inferops-numa), then alternates unpinned and `numa-pin exec --node 0` starts. For
each start it measures the server's own start (spawn to /health answering 200) and the
generation speed of one /completion (llama-server's timings). The helper's cost is the
time numa-pin adds before exec, measured on /bin/true, set against the server's start.

On a host with one NUMA node there is nothing to gain: the ratios show what pinning
costs, which should be nothing (tokens/s ratio ~1.0).
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from timing import REPO, install_helper, time_command


def cached_output(argv):
    """The last line a cache-building script prints: the path it made or found."""
    return subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(port, proc, timeout=600.0):
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            raise SystemExit("llama-server exited with %s before it was ready" % proc.returncode)
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit("llama-server was not ready after %.0f s" % timeout)


def completion(port, tokens):
    body = json.dumps({"prompt": "The socket link costs", "n_predict": tokens, "ignore_eos": True,
                       "cache_prompt": False}).encode()
    request = urllib.request.Request("http://127.0.0.1:%d/completion" % port, data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        timings = json.load(answer)["timings"]
    return timings["predicted_per_second"], timings["prompt_per_second"]


def one_start(prefix, server, model, threads, tokens):
    """(seconds from spawn to ready, generated tokens/s, prompt tokens/s) of one server start."""
    port = free_port()
    argv = prefix + [server, "--model", model, "-t", str(threads), "-c", "512", "--host", "127.0.0.1",
                     "--port", str(port)]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc)
        ready = time.perf_counter() - start
        generated, prompt = completion(port, tokens)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return ready, generated, prompt


def median(values):
    return statistics.median(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size-mb", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    server = os.path.join(cached_output(["bash", os.path.join(REPO, "lab", "llama", "build_server.sh")]),
                          "bin", "llama-server")
    model = cached_output([sys.executable, os.path.join(REPO, "lab", "llama", "make_model.py"),
                           "--size-mb", str(args.size_mb)])
    threads = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as scratch:
        launcher = install_helper(scratch)
        modes = {"unpinned": [], "numa-pin exec --node 0": [launcher, "exec", "--node", "0", "--gpus", "none",
                                                            "--model", model, "--"]}
        samples = {name: [] for name in modes}
        one_start([], server, model, threads, args.tokens)  # warm the page cache and the binary
        for _ in range(args.rounds):
            for name, prefix in modes.items():
                samples[name].append(one_start(prefix, server, model, threads, args.tokens))
        helper = [launcher, "exec", "--node", "0", "--gpus", "none", "--model", model]
        bare = time_command(["/bin/true"], 20)[1]
        costs = {"all": time_command(helper + ["--", "/bin/true"], 20)[1] - bare,
                 "without the page-cache check": time_command(helper + ["--page-cache", "ignore", "--", "/bin/true"],
                                                              20)[1] - bare}
    report(samples, costs, args, threads)


def report(samples, costs, args, threads):
    nodes = len([name for name in os.listdir("/sys/devices/system/node") if name.startswith("node")])
    print("\n== llama-server %d MiB random-weight model, %d threads, %d tokens, %d rounds, host with %d NUMA node(s)"
          % (args.size_mb, threads, args.tokens, args.rounds, nodes))
    rows = {name: [median(column) for column in zip(*runs)] for name, runs in samples.items()}
    base = rows["unpinned"]
    for name, (ready, generated, prompt) in rows.items():
        print("  %-24s start %7.0f ms  generate %6.2f tok/s (ratio %.2f)  prompt %7.2f tok/s (ratio %.2f)"
              % (name, ready * 1e3, generated, generated / base[1], prompt, prompt / base[2]))
    print("  numa-pin's own cost before exec: %.1f ms = %.1f %% of the server's start (%.0f ms); without the "
          "page-cache check of the cached model: %.1f ms"
          % (costs["all"] * 1e3, 100.0 * costs["all"] / base[0], base[0] * 1e3,
             costs["without the page-cache check"] * 1e3))
    if nodes == 1:
        print("  one node here: pinning can only cost, not gain; a ratio of ~1.0 means it costs nothing")


if __name__ == "__main__":
    main()
