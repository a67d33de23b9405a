"""An engine's refusals cover the environment variables it reads as a refused flag (issue 23, item 5):
llama.cpp's common/arg.cpp reads LLAMA_ARG_NUMA as --numa, an empty value as "distribute"."""

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.base.engines import ENGINES, conflicting_flags, recipe

WHY = ("llama.cpp's --numa resets its main thread's CPU affinity to all CPUs after each graph, outside the plan")


@pytest.mark.parametrize("value", ["distribute", "isolate", "numactl", ""])
def test_llama_arg_numa_in_the_servers_environment_is_refused_naming_it_and_the_fix(value):
    assert conflicting_flags("llama.cpp", ["llama-server", "-m", "model.gguf"], {"LLAMA_ARG_NUMA": value}) == [
        "LLAMA_ARG_NUMA in the environment, which llama.cpp reads as --numa (%s; unset it: drop it from the "
        "service's environment)" % WHY]


def test_the_flag_and_its_variable_are_each_named():
    assert conflicting_flags("llama.cpp", ["llama-server", "--numa", "isolate"], {"LLAMA_ARG_NUMA": "isolate"}) == [
        "--numa (%s)" % WHY,
        "LLAMA_ARG_NUMA in the environment, which llama.cpp reads as --numa (%s; unset it: drop it from the "
        "service's environment)" % WHY]


def test_other_variables_and_an_unknown_environment_refuse_nothing():
    environ = {"LLAMA_ARG_THREADS": "8", "LLAMA_ARG_NUMA_X": "1", "llama_arg_numa": "distribute"}
    assert conflicting_flags("llama.cpp", ["llama-server"], environ) == []
    assert conflicting_flags("llama.cpp", ["llama-server"]) == []  # the controller: the server's environment unknown


@pytest.mark.parametrize("engine", [engine for engine in ENGINES if engine != "llama.cpp"])
def test_llama_cpps_variable_is_no_other_engines_conflict(engine):
    assert conflicting_flags(engine, ["server", "--numa"], {"LLAMA_ARG_NUMA": "distribute"}) == []


def test_the_plan_lists_the_flag_its_variable_shares_a_table_entry_with():
    assert recipe("llama.cpp", [], False)["conflicts"] == ["--numa"]


def test_numa_pin_exec_refuses_llama_arg_numa_in_its_environment(monkeypatch):
    from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin
    from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
    from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import Request, plan
    from tests.unit import topo_factory as tf

    placement = plan(tf.dgx_like(), Request(gpus=4, instances=2, instance=1, engine="llama.cpp"))
    monkeypatch.setenv("LLAMA_ARG_NUMA", "distribute")
    with pytest.raises(NumaError, match="refusing engine llama.cpp's LLAMA_ARG_NUMA in the environment.*unset it"):
        numa_pin._check_engine(placement, ["llama-server"], best_effort=False)
    monkeypatch.delenv("LLAMA_ARG_NUMA")
    assert numa_pin._check_engine(placement, ["llama-server"], best_effort=False) == []
