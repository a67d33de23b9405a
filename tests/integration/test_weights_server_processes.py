"""The lab's weights server, started for real: it touches its weights, reports them and stops on SIGTERM."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from tests.unit.test_weights_server import SCRIPT


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
