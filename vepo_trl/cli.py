"""The `vepo-trl` command line.

vepo-trl demo                      train VEPO on a tiny model and synthetic data on the CPU (~35 s on 2 cores)
vepo-trl demo --warm_start         the same from the lab's warm start (SFT'd tiny VLM): a model the reward can improve
vepo-trl demo --model_family F     the same on another family's tiny model (tiny-F, README)
vepo-trl train --config R.yaml     train from a recipe (any key can be overridden: --selection_ratio 0.3)
vepo-trl eval --model M            the paper's seven benchmarks, a Table-1 summary (alias: evaluate; --help)
vepo-trl strategies                list the selection strategies and perturbations
vepo-trl inspect --model M ...     an HTML page of the tokens VEPO selects in a model's responses
vepo-trl analyze --model M ...     the paper's selection analysis (top-k entropy vs top-k JSD) over a data set
vepo-trl plot RUN_DIR [RUN_DIR]    PNG training curves of one or several runs
vepo-trl lab [--quick]             RL from a warm-started tiny VLM: selection strategies x seeds, before/after accuracy
vepo-trl --version                 print the version

Run `vepo-trl <command> --help` for a command's options.
"""

from __future__ import annotations

import sys

from .errors import RunFault, UsageError, fail, one_line


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's preemption, `kill`): raised where the run is, so it unwinds as Ctrl-C does (locks
    released, partial files removed, one line naming what was saved), with exit status 143 (128 + 15)."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


def _safe_console() -> None:
    """Whatever a command prints, the console's encoding takes it (a character it lacks is escaped, `\\xfc`): a run
    that finished its work never ends in exit 1 because a folder name or a model's text cannot be printed."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a closed or detached stream
                pass


COMMANDS = {name: name for name in ("train", "demo", "eval", "strategies", "inspect", "analyze", "plot", "lab")}
COMMANDS["evaluate"] = "eval"  # an alias


def command_main(name: str):
    """The `main(argv)` of `vepo_trl.commands.<name>`: one module per command, imported when it runs."""
    import importlib

    return importlib.import_module(f"vepo_trl.commands.{COMMANDS[name]}").main


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("--version", "-V", "version"):
        from . import __version__

        if argv[1:]:
            fail("vepo-trl", f"{argv[0]} takes no options, got {' '.join(argv[1:])}.")
        print(f"vepo-trl {__version__}")
        return
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__.strip())
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nUnknown command {argv[0]!r}. Commands: {', '.join(COMMANDS)}.", file=sys.stderr)
            sys.exit(2)
        return
    command = argv[0]
    name = COMMANDS[command]
    _safe_console()
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        from .local_models import check_cache

        check_cache(building=False)
        command_main(command)(argv[1:])
    except UsageError as error:  # the one front door: every command's user errors end here as one line
        fail(f"vepo-trl {name}", error)
    except RunFault as error:  # the machine failed the run (a full disk while saving): one line, exit status 1
        print(f"vepo-trl {name}: error: {one_line(error)}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (`Terminated`): one line of what is kept, no traceback
        kept = getattr(stop, "kept", None) or _INTERRUPTED.get(command, "nothing was written")
        terminated = isinstance(stop, Terminated)
        print(
            f"\nvepo-trl {name}: {'terminated (SIGTERM)' if terminated else 'interrupted'}: {kept}.", file=sys.stderr
        )
        sys.exit(143 if terminated else 130)
    except BrokenPipeError:  # `vepo-trl strategies | head`: the reader left; what it read is all it wanted
        import os

        # Python would fail again flushing stdout at exit: point it at nothing (the `signal` module's documented way)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


# What Ctrl-C leaves for the commands that do not say it themselves
_INTERRUPTED = {
    "eval": "the rows finished so far are kept in the output folder; rerun the same command to resume",
    "evaluate": "the rows finished so far are kept in the output folder; rerun the same command to resume",
    "lab": "finished runs (runs/<strategy>-seed<k>/result.json) are kept; rerun the same command to resume",
}


if __name__ == "__main__":
    main()
