"""tests/lab/weights_server.py: numa_maps parsing, and a live server on this host."""
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "lab" / "weights_server.py"
_spec = importlib.util.spec_from_file_location("weights_server", str(SCRIPT))
ws = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ws)

NUMA_MAPS = """\
55d0c0a00000 default file=/usr/bin/python3.11 mapped=120 mapmax=2 N0=120 kernelpagesize_kB=4
7f3a10000000 bind:1 anon=65536 dirty=65536 active=0 N1=65536 kernelpagesize_kB=4
7f3a20000000 bind:1 file=/srv/model.gguf mapped=8455 N0=8455 kernelpagesize_kB=4
7f3a30000000 interleave:0-1 anon=10 dirty=10 N0=5 N1=5 kernelpagesize_kB=4
7f3a40000000 default anon=3 dirty=3 N10=1 N2=2 kernelpagesize_kB=4
7ffd00000000 default stack anon=9 dirty=9 N0=9 kernelpagesize_kB=4
"""


def test_parse_numa_maps_splits_policy_nodes_and_fields():
    entries = ws.parse_numa_maps(NUMA_MAPS + "garbage line\n\n")
    assert len(entries) == 6
    weights = entries[1]
    assert weights["start"] == 0x7F3A10000000
    assert weights["policy"] == "bind:1"
    assert weights["nodes"] == {"N1": 65536}
    assert weights["fields"]["anon"] == "65536"
    assert entries[5]["fields"]["stack"] == ""
    assert entries[2]["fields"]["file"] == "/srv/model.gguf"


def test_mapping_at_finds_the_vma_containing_an_address():
    entries = ws.parse_numa_maps(NUMA_MAPS)
    # An address inside a merged VMA belongs to the VMA that starts below it.
    assert ws.mapping_at(entries, 0x7F3A10000000 + 4096 * 7)["policy"] == "bind:1"
    assert ws.mapping_at(entries, 0x7F3A20000000)["fields"]["file"] == "/srv/model.gguf"
    assert ws.mapping_at(entries, 0x1000) is None


def test_anon_pages_per_node_sums_anonymous_lines_only_in_node_order():
    totals = ws.anon_pages_per_node(ws.parse_numa_maps(NUMA_MAPS))
    assert totals == {"N0": 14, "N1": 65541, "N2": 2, "N10": 1}
    assert list(totals) == ["N0", "N1", "N2", "N10"]


def test_status_field_reads_proc_status_lines():
    text = "Name:\tpython3\nCpus_allowed_list:\t2-3\nMems_allowed_list:\t0-1\n"
    assert ws.status_field(text, "Cpus_allowed_list") == "2-3"
    assert ws.status_field(text, "Mems_allowed_list") == "0-1"
    assert ws.status_field(text, "Missing") == ""


@pytest.fixture
def notify_socket(tmp_path):
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(30)
    yield sock, path
    sock.close()


def test_live_server_reports_its_touched_weights_and_stops_on_sigterm(tmp_path, notify_socket):
    sock, path = notify_socket
    model = tmp_path / "model.bin"
    model.write_bytes(os.urandom(2 * 1024 * 1024))
    env = dict(os.environ, NOTIFY_SOCKET=path)
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--port", "0", "--weights-mb", "16", "--model", str(model)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert sock.recv(256).decode().startswith("READY=1")
        port = int(re.search(r":(\d+) with", proc.stdout.readline()).group(1))
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=30) as resp:
            health = json.loads(resp.read().decode())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    pages = 16 * 1024 * 1024 // 4096
    assert health["pid"] == proc.pid
    assert health["ppid"] == os.getpid()
    assert health["weights_mb"] == 16
    assert sum(health["weights_pages_per_node"].values()) >= pages
    assert sum(health["pages_per_node"].values()) >= pages
    assert health["numa_maps_policy"] == "default"
    assert health["cpus_allowed_list"] and health["mems_allowed_list"]
    assert sum(health["model"]["pages_per_node"].values()) == 512
