#!/usr/bin/env python3
"""Stand-in inference server for the NUMA lab: holds "weights", reports placement.

    weights_server.py --port N --weights-mb M [--model PATH] [--host ADDR]

Before listening it maps M MiB of anonymous memory and writes one byte per page,
so every page is faulted in under whatever CPU affinity and memory policy the
process inherited (numa-pin, numactl, systemd). Optionally it maps a model file
and reads one byte per page, pulling it into the page cache the way llama.cpp's
mmap loader does. GET /health answers JSON: pid, ppid, cpus_allowed_list,
mems_allowed_list, weights_mb, pages_per_node (anonymous pages summed over all
mappings), numa_maps_policy (policy of the weights mapping, e.g. "bind:1"),
weights_pages_per_node, model (path, policy, pages_per_node) or null, and the
argv and environment it was started with.

Python stdlib only (>= 3.8) because it runs inside the minimal lab guest.
Signals readiness with sd_notify READY=1 when started as a Type=notify unit.
"""

import argparse
import ctypes
import json
import mmap
import os
import signal
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Dict, List, Optional

MIB = 1024 * 1024


def parse_numa_maps(text: str) -> List[Dict[str, object]]:
    """Parse /proc/<pid>/numa_maps into [{start, policy, fields, nodes}], in file order.

    A line is `<hex start> <policy> key=value... flag...`; N<id>=<pages> items
    become `nodes` ({"N0": pages}), other key=value items become `fields`.
    """
    entries = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        try:
            start = int(parts[0], 16)
        except ValueError:
            continue
        fields = {}  # type: Dict[str, str]
        nodes = {}  # type: Dict[str, int]
        for item in parts[2:]:
            key, sep, value = item.partition("=")
            if not sep:
                fields[key] = ""
            elif key[:1] == "N" and key[1:].isdigit() and value.isdigit():
                nodes[key] = int(value)
            else:
                fields[key] = value
        entries.append({"start": start, "policy": parts[1], "fields": fields, "nodes": nodes})
    return entries


def mapping_at(entries: List[Dict[str, object]], address: int) -> Optional[Dict[str, object]]:
    """The mapping containing address: the last one starting at or below it.

    The kernel may merge our anonymous region with an adjacent one, so its VMA can
    start below the address mmap returned.
    """
    found = None
    for entry in entries:
        if entry["start"] <= address:  # type: ignore[operator]
            if found is None or entry["start"] > found["start"]:  # type: ignore[operator]
                found = entry
    return found


def anon_pages_per_node(entries: List[Dict[str, object]]) -> Dict[str, int]:
    """Anonymous pages per node over all mappings, in N<id> order."""
    totals = {}  # type: Dict[str, int]
    for entry in entries:
        if "anon" not in entry["fields"]:  # type: ignore[operator]
            continue
        for node, pages in entry["nodes"].items():  # type: ignore[union-attr]
            totals[node] = totals.get(node, 0) + pages
    return dict(sorted(totals.items(), key=lambda kv: int(kv[0][1:])))


def status_field(text: str, key: str) -> str:
    """A value from /proc/<pid>/status text ("" when absent)."""
    prefix = key + ":"
    for line in text.splitlines():
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    return ""


def buffer_address(buf: mmap.mmap) -> int:
    # mmap objects do not expose their address; ctypes can, without copying.
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def touch_pages(buf: mmap.mmap, write: bool) -> None:
    """Fault in every page: a write allocates anon memory, a read fills page cache."""
    step = mmap.PAGESIZE
    if write:
        for offset in range(0, len(buf), step):
            buf[offset] = 1
    else:
        for offset in range(0, len(buf), step):
            buf[offset]  # noqa: B018 (the read is the point)


class Weights:
    """The memory the server holds and how to describe where it lives."""

    def __init__(self, weights_mb: int, model: Optional[str]) -> None:
        self.weights_mb = weights_mb
        self.weights = mmap.mmap(-1, weights_mb * MIB, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        touch_pages(self.weights, write=True)
        self.weights_addr = buffer_address(self.weights)
        self.model_path = model
        self.model = None  # type: Optional[mmap.mmap]
        self.model_addr = 0
        if model:
            # Copy-on-write keeps the buffer writable for ctypes; reads alone share
            # the page cache exactly like llama.cpp's read-only mmap.
            with open(model, "rb") as handle:
                self.model = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
            touch_pages(self.model, write=False)
            self.model_addr = buffer_address(self.model)

    def report(self) -> Dict[str, object]:
        with open("/proc/self/numa_maps") as handle:
            entries = parse_numa_maps(handle.read())
        with open("/proc/self/status") as handle:
            status = handle.read()
        weights = mapping_at(entries, self.weights_addr) or {"policy": "", "nodes": {}}
        report = {
            "pid": os.getpid(), "ppid": os.getppid(),
            "cpus_allowed_list": status_field(status, "Cpus_allowed_list"),
            "mems_allowed_list": status_field(status, "Mems_allowed_list"),
            "weights_mb": self.weights_mb,
            "pages_per_node": anon_pages_per_node(entries),
            "numa_maps_policy": weights["policy"],
            "weights_pages_per_node": weights["nodes"],
            "model": None,
            # What it was started with: the lab compares them with the plan's engine recipe.
            "argv": sys.argv[1:],
            "environment": dict(os.environ),
        }  # type: Dict[str, object]
        if self.model is not None:
            mapped = mapping_at(entries, self.model_addr) or {"policy": "", "nodes": {}}
            report["model"] = {"path": self.model_path, "policy": mapped["policy"],
                               "pages_per_node": mapped["nodes"]}
        return report


def make_handler(weights: Weights):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            if self.path.split("?")[0] != "/health":
                self.send_error(404, "only /health exists")
                return
            body = json.dumps(weights.report()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            # Access logs would flood journald on every health probe.
            return

    return Handler


def sd_notify(message: str) -> None:
    """Send a systemd notification when NOTIFY_SOCKET is set (Type=notify units)."""
    path = os.environ.get("NOTIFY_SOCKET", "")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(message.encode(), path)
        except OSError as exc:
            print("weights_server: sd_notify failed: %s" % exc, file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--weights-mb", type=int, required=True)
    parser.add_argument("--model", help="file to mmap and read fully (page cache)")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    if args.weights_mb < 1:
        parser.error("--weights-mb must be at least 1")
    try:
        weights = Weights(args.weights_mb, args.model)
        server = HTTPServer((args.host, args.port), make_handler(weights))
    except OSError as exc:
        print("weights_server: cannot start: %s" % exc, file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    sd_notify("READY=1\nMAINPID=%d" % os.getpid())
    # The bound port, so --port 0 lets a caller pick a free one race-free.
    print("weights_server: pid %d serving on %s:%d with %d MiB of weights"
          % (os.getpid(), args.host, server.server_address[1], args.weights_mb), flush=True)
    while not stop.wait(1.0):
        pass
    sd_notify("STOPPING=1")
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
