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


def check_output_folder(flag: str, folder) -> None:
    """A folder results can be written to: not a file, not under a file, in a writable place (a `UsageError`
    naming `flag` otherwise). The folder itself need not exist yet."""
    import os
    from pathlib import Path

    if folder is None or not str(folder).strip():
        raise UsageError(f"{flag} is empty: give a folder.")
    path = Path(folder).expanduser()
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # not made yet, or under a file (said below)
        pass
    except OSError as error:  # a name longer than the file system takes, a component that is not a folder, ...
        raise UsageError(f"{flag} {folder}: not a usable folder name ({error.strerror}).") from None
    if path.is_symlink() and not path.exists():
        raise UsageError(f"{flag} {folder}: a link to {os.readlink(path)}, which does not exist; give a folder.")
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {folder}: a file of that name exists; give a folder.")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{flag} {folder}: {existing} is a file, so no folder can be made under it.")
    # Names still to be made: the kernel says ENOENT before ENAMETOOLONG when a parent is missing, so a name
    # longer than the file system takes is only found at the first write (after the model loaded)
    try:
        longest = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = 255
    to_make = path.absolute().relative_to(existing.absolute()).parts if path != existing else ()
    too_long = [part for part in to_make if len(os.fsencode(part)) > longest]
    if too_long:
        raise UsageError(
            f"{flag} {folder}: not a usable folder name (a name of {len(os.fsencode(too_long[0]))} bytes, and the "
            f"file system takes {longest})."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {folder}: {existing} is not writable; choose a folder you can write to.")
    import shutil

    if shutil.disk_usage(existing).free == 0:
        raise UsageError(f"{flag} {folder}: the disk holding {existing} is full (0 bytes free).")
