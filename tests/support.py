"""Helpers the test modules share (in the role of TRL's tests/testing_utils.py)."""


def overridden(argv: list[str], *options: str) -> list[str]:
    """`argv` with `options` (flag value pairs) replacing the same flags' values, or added: every command refuses a
    flag given twice, so a test that changes a base command line's value replaces it."""
    argv = list(argv)
    for flag, value in zip(options[::2], options[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv
