"""The one error type the package raises on purpose."""


class NumaError(Exception):
    """An expected failure. Its message names the cause and the fix.

    Modules turn it into ``fail_json(msg=...)`` and the CLI into one line on
    stderr and a non-zero exit; anything else escaping is a bug.
    """
