"""The kernel's cpu/node list syntax, read and written."""
import pytest
from hypothesis import given, strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.cpulist import format_cpulist, parse_cpulist
from ansible_collections.inferops.numa.plugins.module_utils.numa.errors import NumaError


@pytest.mark.parametrize("text, expected", [
    ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
    ("0", [0]),
    ("", []),
    ("  \n", []),
    ("0-27,56-83\n", list(range(0, 28)) + list(range(56, 84))),
    ("5,1-2,2", [1, 2, 5]),
    (" 1 , 3 ", [1, 3]),
    ("7-7", [7]),
])
def test_parse_cpulist(text, expected):
    assert parse_cpulist(text) == expected


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "0-3,", "1,,2", "0-7:2", "1.5", "0-99999999"])
def test_parse_cpulist_rejects_garbage_naming_it(text):
    with pytest.raises(NumaError) as error:
        parse_cpulist(text)
    assert repr(text) in str(error.value)


def test_parse_cpulist_rejects_non_string():
    with pytest.raises(NumaError):
        parse_cpulist([0, 1])


@pytest.mark.parametrize("ids, expected", [
    ([0, 1, 2, 3, 8, 10, 11], "0-3,8,10-11"),
    ([11, 10, 8, 3, 2, 1, 0, 3], "0-3,8,10-11"),
    ([], ""),
    ([5], "5"),
    ({4, 5}, "4-5"),
])
def test_format_cpulist(ids, expected):
    assert format_cpulist(ids) == expected


@given(st.sets(st.integers(min_value=0, max_value=4096)))
def test_format_then_parse_round_trips(ids):
    assert parse_cpulist(format_cpulist(ids)) == sorted(ids)
