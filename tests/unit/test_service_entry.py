"""service_entry.service_requests: an inference_service_list entry and a topology to the instance count and the
request, the one function the role's tasks and the fleet report both call. Expectations are literals."""

import os

import yaml

from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import request
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs.service_entry import (
    DEFAULT_LAYOUT, LAYOUTS, service_requests)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENTRY_SPEC = os.path.join(REPO, "roles", "inference_service", "meta", "argument_specs.yml")

# Two nodes with CPUs, a memory-only node between them (ids need not be dense), three GPUs.
HOST = {"nodes": [{"id": 0, "has_cpus": True}, {"id": 2, "has_cpus": False}, {"id": 3, "has_cpus": True}],
        "gpus": [{"address": "0000:17:00.0"}, {"address": "0000:65:00.0"}, {"address": "0000:b1:00.0"}]}


def entry_spec():
    with open(ENTRY_SPEC) as handle:
        spec = yaml.safe_load(handle)
    return spec["argument_specs"]["main"]["options"]["inference_service_list"]["options"]


def test_per_node_is_one_instance_per_node_with_cpus_each_anchored_on_its_node():
    wanted = service_requests({"name": "llama", "layout": "per_node", "model": "/m/llama.gguf"}, HOST)
    assert wanted["error"] is None and wanted["instances"] == 2
    assert wanted["request"]["anchors"] == "0,3"
    assert wanted["request"]["gpus"] == "none"
    assert (wanted["request"]["model"], wanted["request"]["model_size"]) == ("/m/llama.gguf", "/m/llama.gguf")


def test_per_socket_is_one_instance_per_package_anchored_on_its_first_cpu_node_over_the_whole_socket():
    # Package 1 lists its nodes out of order; package 2 holds only the memory-only node 2; package 3 has no node.
    host = dict(HOST, nodes=HOST["nodes"] + [{"id": 5, "has_cpus": True}],
                cpus={"packages": [{"id": 0, "nodes": [0, 2]}, {"id": 1, "nodes": [5, 3]}, {"id": 2, "nodes": [2]},
                                   {"id": 3, "nodes": []}]})
    wanted = service_requests({"name": "llama", "layout": "per_socket", "model": "/m/llama.gguf"}, host)
    assert wanted["error"] is None and wanted["instances"] == 2
    assert (wanted["request"]["anchors"], wanted["request"]["scope"], wanted["request"]["policy"]) == (
        "0,3", "socket", "interleave")
    assert wanted["request"]["gpus"] == "none"
    given = service_requests({"name": "llama", "layout": "per_socket", "scope": "node", "policy": "bind"}, host)
    assert (given["request"]["scope"], given["request"]["policy"]) == ("node", "bind")


def test_per_gpu_is_one_instance_per_gpu_with_one_gpu_each():
    wanted = service_requests({"name": "vllm", "layout": "per_gpu", "model_size": "30G"}, HOST)
    assert (wanted["instances"], wanted["request"]["gpus"], wanted["request"]["anchors"]) == (3, 1, None)
    assert (wanted["request"]["model"], wanted["request"]["model_size"]) == (None, "30G")


def test_gpu_groups_is_one_instance_per_whole_group():
    assert service_requests({"name": "g", "layout": "gpu_groups", "gpus": 2}, HOST)["instances"] == 1
    assert service_requests({"name": "g", "layout": "gpu_groups", "gpus": "1"}, HOST)["instances"] == 3
    assert service_requests({"name": "g", "layout": "gpu_groups", "gpus": 2}, HOST)["request"]["gpus"] == 2


def test_single_is_one_instance_leaving_the_gpus_to_the_planner():
    wanted = service_requests({"name": "s", "node": 3, "smt": False, "port_base": 9000}, HOST)
    assert wanted["instances"] == 1
    assert {key: wanted["request"][key] for key in ("gpus", "node", "smt", "port_base", "anchors", "instances")} == {
        "gpus": None, "node": 3, "smt": False, "port_base": 9000, "anchors": None, "instances": 1}


def test_an_explicit_gpus_wins_over_the_layouts_choice():
    assert service_requests({"name": "n", "layout": "per_node", "gpus": "auto"}, HOST)["request"]["gpus"] == "auto"
    assert service_requests({"name": "p", "layout": "per_gpu", "gpus": 0}, HOST)["request"]["gpus"] == 0


def test_the_request_holds_every_option_but_the_instance_unset_ones_null():
    wanted = service_requests({"name": "s"}, HOST)
    assert set(wanted["request"]) == set(request.BY_NAME) - {"instance"}
    assert [key for key, value in wanted["request"].items() if value is not None] == ["instances"]


def test_a_layout_without_instances_here_says_why_and_how_to_fix_it():
    no_gpus = {"nodes": [{"id": 0, "has_cpus": True}], "gpus": []}
    assert service_requests({"name": "v", "layout": "per_gpu"}, no_gpus) == {
        "instances": 0, "request": None,
        "error": "layout per_gpu gives no instance here (0 GPUs, 1 nodes with CPUs): use layout single or per_node"}
    assert service_requests({"name": "g", "layout": "gpu_groups", "gpus": 4}, HOST)["error"] == (
        "layout gpu_groups gives no instance here (3 GPUs, 2 nodes with CPUs, gpus 4 per instance): use layout "
        "single or per_node, or give gpu_groups a GPU count no larger than the host has")


def test_gpu_groups_takes_only_a_plain_positive_count():
    for size in (0, "0", "02", "-1", "two", None, True, "2.0", "\u0662"):
        assert service_requests({"name": "g", "layout": "gpu_groups", "gpus": size}, HOST)["instances"] == 0, size


def test_an_unknown_layout_is_named_with_the_valid_ones():
    assert service_requests({"name": "x", "layout": "sideways"}, HOST)["error"] == (
        "layout 'sideways' is none of single, per_node, per_socket, per_gpu, gpu_groups")


def test_the_layouts_and_their_default_are_the_roles():
    layout = entry_spec()["layout"]
    assert (tuple(layout["choices"]), layout["default"]) == (LAYOUTS, DEFAULT_LAYOUT)
