"""tests/lab/weights_server.py: numa_maps parsing, and a live server on this host."""
import importlib.util
from pathlib import Path


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
