"""How a command declares its options, and the one parser built from the declaration.

Each command with its own options (`eval`, `inspect`, `analyze`, `plot`, `lab`, `strategies`) declares them once, as a
dataclass whose fields are made by `option` (default, help text, the value rule, the help group), in the manner of
`VEPOConfig` and TRL's script arguments. `parser_for` reads the declaration into argparse (type, list, flag and
choices from the field's type and rule), so the parser, `--help`, the value checks, the tests and
`benchmarks/bad_inputs.py` all read the same fields. `OneLineParser`'s errors are one line (exit 2); it refuses a flag
given twice, sends every parsed value (defaults included) through its field's rule (`validation.check_options`) and
returns the declaration filled in. `train` and `demo` take TRL's parser over `VEPOConfig` and the script's dataclasses,
with the same repeat rule and value table (`validation.RANGES`) through `commands.train._parse`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from typing import Any, NoReturn

from .errors import UsageError
from .validation import check_repeated, flag_name


def option(default: Any = None, help: str = "", *, rule, reads, group: str | None = None, positional: bool = False,
           required: bool = False, repeatable: bool = False, metavar: str | None = None, choices=None) -> Any:  # fmt: skip
    """One declared option: a dataclass field carrying its help text, its value rule (`validation.Rule`), when a run
    reads it (`validation.Reads`: `ALWAYS`, or a condition over the other options; a given option the run would not
    read is refused) and its help group. `repeatable`: a list given by repeating the flag (argparse's append)."""
    metadata = {
        "help": help, "rule": rule, "reads": reads, "group": group, "positional": positional, "required": required,
        "repeatable": repeatable, "metavar": metavar, "choices": choices,
    }  # fmt: skip
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def declared_reads(declaration) -> dict[str, Any]:
    """When a run reads each declared option (`validation.Reads`), by name."""
    return {field.name: field.metadata["reads"] for field in dataclasses.fields(declaration)}


def declared_rules(declaration) -> dict[str, Any]:
    """Each declared option's rule, by name (`TypeError` for a field declared without one: a bug)."""
    rules = {}
    for field in dataclasses.fields(declaration):
        if field.metadata.get("rule") is None:
            raise TypeError(
                f"{declaration.__name__}.{field.name}: an option declared without a rule (options.option)."
            )
        rules[field.name] = field.metadata["rule"]
    return rules


def flag_of(field: dataclasses.Field) -> str:
    """How a user writes the option: `--name`, or the metavar of a positional one."""
    if field.metadata.get("positional"):
        return field.metadata.get("metavar") or field.name.upper()
    return f"--{field.name}"


def _kind(annotation) -> tuple[type, bool]:
    """The element type of a field's annotation and whether it is a list (`int | None` -> int, `list[float]` ->
    float, list)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(part for part in typing.get_args(annotation) if part is not type(None))
    if typing.get_origin(annotation) is list:
        return typing.get_args(annotation)[0], True
    return annotation, False


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: X)" after an option's help, where the help does not say its default already and there is
    one to say (not unset, not a flag left off)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def parser_for(declaration, *, prog: str, description: str | None = None,
               formatter_class=argparse.HelpFormatter) -> OneLineParser:  # fmt: skip
    """The argparse parser of a declaration: each field one option, in its group, in the declared order."""
    # No abbreviations: `--max_new 9 --max_new_tokens 5` would hide a flag given twice
    parser = OneLineParser(prog=prog, description=description, formatter_class=formatter_class, allow_abbrev=False)
    parser.declaration = declaration
    parser.rules = declared_rules(declaration)
    hints = typing.get_type_hints(declaration)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for field in dataclasses.fields(declaration):
        meta = field.metadata
        group = meta["group"]
        target = (
            parser
            if group is None
            else groups.get(group) or groups.setdefault(group, parser.add_argument_group(group))
        )
        element, is_list = _kind(hints[field.name])
        kwargs: dict[str, Any] = {"help": meta["help"] or None}
        if element is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs["default"] = field.default_factory() if field.default is dataclasses.MISSING else field.default
            if element in (int, float):
                kwargs["type"] = element
            if is_list:
                kwargs["action" if meta["repeatable"] else "nargs"] = "append" if meta["repeatable"] else "+"
            for key in ("metavar", "choices"):
                if meta[key] is not None:
                    kwargs[key] = meta[key]
        if meta["positional"]:
            target.add_argument(field.name, **kwargs)
        else:
            target.add_argument(f"--{field.name}", required=meta["required"], **kwargs)
    return parser


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors on one line (no usage block) and exit code 2, as every vepo-trl command reports;
    a flag given twice is refused, and every parsed value goes through its declared rule (`validation.check_options`),
    so a command's options obey the same rules as every other command's. Built by `parser_for`."""

    declaration: Any = None
    rules: dict[str, Any] = {}

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)  # the CLI's one door prints it: `<prog>: error: <message>`, exit 2

    def parse_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        # `--max-new-tokens` is `--max_new_tokens`: one spelling, so the repeat rule and the messages see one option
        known = {string for action in self._actions for string in action.option_strings}
        end = argv.index("--") if "--" in argv else len(argv)
        for index, token in enumerate(argv[:end]):
            name, equals, value = token.partition("=")
            if name.startswith("--") and "-" in name[2:] and "--" + flag_name(name) in known:
                argv[index] = "--" + flag_name(name) + equals + value
        try:
            check_repeated(argv, self._repeatable())
        except UsageError as error:
            self.error(str(error))
        parsed = super().parse_args(argv, namespace)
        if self.declaration is None:
            return parsed
        from .validation import check_combinations, check_options, check_read

        flags = {field.name: flag_of(field) for field in dataclasses.fields(self.declaration)}
        given = {flag_name(token) for token in argv if token.startswith("--") and len(token) > 2}
        try:
            check_options(self.rules, vars(parsed), flags)
            check_read(declared_reads(self.declaration), vars(parsed), given)
            check_combinations(vars(parsed), command=self.prog.split()[-1])  # every option has its value here
        except (UsageError, ValueError) as error:
            self.error(str(error))
        return self.declaration(**vars(parsed))

    def _get_value(self, action, arg_string):
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError:
            rule = self.rules.get(action.dest)
            if rule is None or not action.option_strings:
                raise
            # argparse says "invalid int value"; the declared rule says what the value must be
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
