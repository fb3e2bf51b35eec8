"""The one parser of every command with its own options (`eval`, `inspect`, `analyze`, `plot`, `lab`,
`strategies`): argparse whose errors are one line (exit 2), which refuses a flag given twice, and whose every parsed
value goes through the one table of option rules (`validation.OPTION_RULES`). `train` and `demo` take TRL's parser;
the same repeat rule and table (`validation.RANGES`) reach them through `commands.train._parse`."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from .errors import UsageError, fail


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors on one line (no usage block) and exit code 2, as every vepo-trl command reports;
    a flag given twice is refused, and every parsed value goes through the one table of option rules
    (`validation.check_options`), so a command's options obey the same rules as every other command's."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, message)

    def parse_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        try:
            check_repeated(argv, self._repeatable())
        except UsageError as error:
            self.error(str(error))
        parsed = super().parse_args(argv, namespace)
        from .validation import check_options

        try:
            check_options(self.prog.split()[-1], vars(parsed))
        except UsageError as error:
            self.error(str(error))
        return parsed

    def _get_value(self, action, arg_string):
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError:
            from .validation import option_rule

            rule = option_rule(self.prog.split()[-1], action.dest)
            if rule is None or not action.option_strings:
                raise
            # argparse says "invalid int value"; the table says what the value must be
            raise argparse.ArgumentError(
                None, f"{action.option_strings[-1]} {arg_string!r}: text, must be {rule.valid}."
            ) from None

    def _repeatable(self) -> dict[str, bool]:
        """Each option string: whether giving it again adds to it (append) rather than replacing it."""
        return {
            string: isinstance(action, (argparse._AppendAction, argparse._CountAction))
            for action in self._actions
            for string in action.option_strings
        }


def check_repeated(argv: list[str], repeatable: dict[str, bool] | None = None) -> None:
    """A flag given twice is a mistake to say, not a value to replace silently (a recipe's key and the command line
    are not a repeat: the command line overrides the recipe by design). `repeatable`: the flags that add up."""
    seen: dict[str, str] = {}
    for index, token in enumerate(argv):
        if not token.startswith("--") or len(token) == 2:
            continue
        if token == "--":
            break
        flag, equals, value = token.partition("=")
        if repeatable is not None and repeatable.get(flag, False):
            continue
        if not equals:
            value = argv[index + 1] if index + 1 < len(argv) and not argv[index + 1].startswith("--") else ""
        if flag in seen:
            first, then = seen[flag], value
            both = f" ({first}, then {then})" if first or then else ""
            raise UsageError(f"{flag} is given twice{both}: give it once.")
        seen[flag] = value
