"""What one value must be, and the check of a value against it: the rule engine every table of rules uses
(`validation`'s RANGES and the commands' declarations, the data generators' arguments). Layer 0: no import of the
package's higher layers, so the data code can state its rules with it too."""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """What one field's value must be. `kind`: "whole" (a whole number), "number" (a finite number), "numbers" (a
    list of finite numbers), "choice", "bool", "mapping" (a mapping, or its JSON inline: transformers' dict fields),
    "mapping_file" (those, or a path to an existing JSON file). `test` takes the converted value; `valid` says in words what passes."""

    kind: str
    valid: str
    test: Callable[[object], bool] | None = None
    optional: bool = False
    choices: Callable[[], Iterable[str]] | None = None
    # For a choice: why a value is not among `choices` where there is more to say (a plug-in that failed to load)
    why_not: Callable[[object], str | None] | None = None


def _at_least(low):
    return lambda v: v >= low


def _above(low):
    return lambda v: v > low


def _between(low, high, *, low_open=False, high_open=False):
    return lambda v: (v > low if low_open else v >= low) and (v < high if high_open else v <= high)


def _whole(test, valid, optional=False) -> Rule:
    return Rule("whole", valid, test, optional)


def _number(test, valid, optional=False) -> Rule:
    return Rule("number", valid, test, optional)


def _names(*names, boolean=False) -> Rule:
    """One of `names` (`boolean`: a YAML true / false passes too)."""
    rule = Rule("choice", f"one of {', '.join(names)}", choices=lambda: names)
    return dataclasses.replace(rule, kind="choice_or_bool") if boolean else rule


def _refuse(name, value, rule: Rule):
    raise ValueError(f"--{name} {_show(value)}: must be {rule.valid}.")


def _suggest(value) -> str:
    """The number a mistyped value likely meant, as Python code (`"0.2"` -> `0.2`), else `<a number>`."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "<a number>"
    return str(int(number)) if number.is_integer() and "." not in str(value) else str(number)


def _show(value) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(_show(v) for v in value)
    return repr(value) if isinstance(value, str) else str(value)


def check_value(name: str, value, rule: Rule):
    """`value` (already converted) against `rule`; returns it (a whole float such as YAML's 500.0 as an int)."""
    if value is None:
        if rule.optional or rule.kind == "numbers":
            return None
        _refuse(name, value, rule)
    if rule.kind == "choice_or_bool" and isinstance(value, bool):
        return value
    if isinstance(value, enum.Enum) and rule.kind == "choice":  # a member of the field's enum (transformers' own)
        return value if value.value in tuple(rule.choices()) else _refuse(name, value.value, rule)
    if rule.kind in ("choice", "choice_or_bool"):
        names = tuple(rule.choices())
        if (value.lower() if isinstance(value, str) and rule.kind == "choice_or_bool" else value) not in names:
            if rule.why_not is not None and (why := rule.why_not(value)):
                raise ValueError(f"--{name} {_show(value)}: {why}.")
            listed = "" if rule.valid.startswith("one of") else f" (one of {', '.join(sorted(names))})"
            # YAML reads an unquoted no / yes / off / on as a boolean
            quote = (
                f" (a recipe's unquoted {'no' if not value else 'yes'} is YAML for {str(value).lower()}: quote it, "
                f'{name}: "{"no" if not value else "yes"}")'
                if isinstance(value, bool)
                else ""
            )
            raise ValueError(f"--{name} {_show(value)}: must be {rule.valid}{listed}{quote}.")
        return value
    if rule.kind == "bool":
        if not isinstance(value, bool):
            _refuse(name, value, rule)
        return value
    if rule.kind in ("mapping", "mapping_file"):
        _check_mapping(name, value, rule)
        return value
    if rule.kind == "numbers":
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if isinstance(item, bool) or not isinstance(item, numbers.Real):
                raise ValueError(
                    f"--{name} {_show(value)}: {_show(item)} is a {type(item).__name__}, must be {rule.valid} (a "
                    "list of numbers, e.g. [0.9, 0.1])."
                )
            if not math.isfinite(item) or (rule.test is not None and not rule.test(item)):
                _refuse(name, value, rule)
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        # The type is the problem (a Python caller's "0.2"), not the range: say so
        raise ValueError(
            f"--{name} {_show(value)}: a {type(value).__name__}, must be a number: {rule.valid} (pass {name}="
            f"{_suggest(value)})."
        )
    if not math.isfinite(value):
        _refuse(name, value, rule)
    if rule.kind == "whole":
        if not float(value).is_integer():
            _refuse(name, value, rule)
        value = int(value)
    if rule.test is not None and not rule.test(value):
        _refuse(name, value, rule)
    return value


def _check_mapping(name: str, value, rule: Rule) -> None:
    """A dict field of transformers' (`_VALID_DICT_FIELDS`): a mapping or a config object (Python), JSON text of a
    mapping (transformers parses text that starts with `{`), and for `mapping_file` a path to a file (DeepSpeed's
    also a base64 JSON, as accelerate passes it). Other text stays text, to fail where the run first reads it
    (`generation_kwargs: x`, `accelerator_config: 7` opened file descriptor 7). `--deepspeed` is a DeepSpeed JSON
    config (not accelerate's YAML, which goes to `accelerate launch --config_file`) with the deepspeed package
    installed (transformers needs it to read the file, 60 lines deep otherwise)."""
    import importlib.util
    import json
    from pathlib import Path

    is_file = False
    if isinstance(value, Mapping) or dataclasses.is_dataclass(value):
        pass
    elif not isinstance(value, str):
        _refuse(name, value, rule)
    elif value.startswith("{"):
        try:
            parsed = json.loads(value)
        except ValueError as error:
            raise ValueError(f"--{name} {_show(value)}: not JSON ({error}); must be {rule.valid}.") from None
        if not isinstance(parsed, dict):
            _refuse(name, value, rule)
    elif rule.kind != "mapping_file":
        raise ValueError(f"--{name} {_show(value)}: must be {rule.valid}.")
    elif Path(value).expanduser().is_file():
        is_file = True
    elif not (name == "deepspeed" and _base64_json(value)):
        where = "is a folder" if Path(value).expanduser().is_dir() else "does not exist"
        raise ValueError(f"--{name} {_show(value)}: {where}; must be {rule.valid}.")
    if name != "deepspeed":
        return
    if is_file:
        path = Path(value).expanduser()
        try:
            config = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            config = None
        if not isinstance(config, dict):
            hint = (
                " (it reads as an accelerate config: pass it as accelerate launch --config_file, and --deepspeed "
                "its deepspeed_config_file, if any)"
                if path.suffix.lower() in (".yaml", ".yml")
                else ""
            )
            raise ValueError(f"--deepspeed {value}: not a DeepSpeed JSON config{hint}.")
    if importlib.util.find_spec("deepspeed") is None:
        raise ValueError(
            f"--deepspeed {value if isinstance(value, str) else '{...}'}: the deepspeed package is not installed "
            "(pip install 'vepo-trl[deepspeed]')."
        )


def _base64_json(text: str) -> bool:
    """Whether `text` is a DeepSpeed config as base64 JSON (transformers' `HfDeepSpeedConfig` reads that form)."""
    import base64
    import binascii
    import json

    try:
        return isinstance(json.loads(base64.urlsafe_b64decode(text).decode("utf-8")), dict)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False


def image_bounds_rules(min_pixels, image_factor) -> dict[str, Rule]:
    """The image bounds a data loader resizes with, given the multiple its model's processor rounds sides to: each a
    whole number of pixels, `max_pixels` at least `min_pixels` and one merged patch (`image_factor**2`)."""
    numeric = all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (min_pixels, image_factor))
    floor = max(min_pixels, image_factor**2) if numeric else 1  # a value that is no number is refused by its own rule
    return {
        "image_factor": Rule("whole", "a whole number >= 1", lambda v: v >= 1),
        "min_pixels": Rule("whole", "a whole number of pixels >= 1", lambda v: v >= 1),
        "max_pixels": Rule(
            "whole", f"a whole number of pixels >= min_pixels and image_factor**2 ({floor})", lambda v: v >= floor
        ),
    }
