"""The one front door for user errors: every command and the Python API raise `UsageError`, the CLI prints it.

A `UsageError` is a mistake in what the user asked for (an argument, a file, a folder), found before any model or data
loads where the input allows it. The CLI prints it as one line, `vepo-trl <command>: error: <message>`, and exits
with status 2 (argparse's convention); from Python it is a `ValueError` with the same message.
"""

from __future__ import annotations

import sys
from typing import NoReturn


class UsageError(ValueError):
    """A mistake in the arguments, files or folders of a run; its message names the problem and the fix."""


class RunFault(RuntimeError):
    """A fault of the machine during a run (a disk that filled up while saving): the CLI prints it as one line and
    exits with status 1. Its message says what was kept, what was removed and how to go on."""


def one_line(message: object) -> str:
    """The message on one line: newlines and runs of spaces collapse, so an error never spans several lines."""
    return " ".join(str(message).split())


def fail(prog: str, message: object) -> NoReturn:
    """Print `<prog>: error: <message>` as one line on stderr and exit with status 2."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
    sys.exit(2)
