"""The one error type the package raises on purpose, and how its messages quote what they were given."""

# How much of a hostile value an error message repeats: it stays one readable line.
_SHOWN_CHARS = 40


class NumaError(Exception):
    """An expected failure. Its message names the cause and the fix.

    Modules turn it into ``fail_json(msg=...)`` and the CLI into one line on
    stderr and a non-zero exit; anything else escaping is a bug.
    """


def shown(value: object) -> str:
    """``repr(value)`` cut to a readable length: an error message repeats hostile input in one short line.

    An int too long for str() (Python refuses past ~4300 digits) is named by its size instead.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "(a %d-bit number)" % value.bit_length()
    text = repr(value)
    if len(text) <= _SHOWN_CHARS:
        return text
    return "%s...(%d characters)" % (text[:_SHOWN_CHARS], len(text))
