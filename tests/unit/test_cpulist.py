"""The kernel's cpu/node list syntax, read and written."""
import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.base.cpulist import (
    MAX_CPUS, MAX_NODES, format_cpulist, parse_cpulist)
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError

# Seeded and bounded: the same few hundred texts at every run.
PARSER_SETTINGS = settings(max_examples=300, deadline=None, derandomize=True)


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


@PARSER_SETTINGS
@given(st.text(alphabet="0123456789-, \n\u0661x", max_size=40) | st.text(max_size=40),
       st.integers(min_value=1, max_value=1 << 20))
def test_any_text_is_a_bounded_list_or_a_one_line_error(text, limit):
    try:
        ids = parse_cpulist(text, limit)
    except NumaError as error:
        assert "\n" not in str(error) and len(str(error)) < 300
        return
    assert ids == sorted(set(ids)) and all(0 <= cpu < limit for cpu in ids)
    assert ids == oracle(text)


def oracle(text):
    """The kernel's syntax read the plain way, for texts the parser took."""
    ids = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        first, _, last = item.partition("-")
        ids.update(range(int(first), int(last or first) + 1))
    return sorted(ids)


@pytest.mark.parametrize("text", ["9" * 5000, "0-" + "9" * 5000, "0-8192", "8192"])
def test_a_number_past_the_limit_is_refused_before_it_is_built(text):
    with pytest.raises(NumaError, match="not a plausible|past the last possible"):
        parse_cpulist(text, MAX_CPUS)


def test_the_kernel_limits_are_what_sysfs_can_print():
    assert parse_cpulist("0-%d" % (MAX_CPUS - 1), MAX_CPUS)[-1] == MAX_CPUS - 1
    assert parse_cpulist("0-%d" % (MAX_NODES - 1), MAX_NODES)[-1] == MAX_NODES - 1
