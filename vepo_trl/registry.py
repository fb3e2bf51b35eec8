"""The one registry mechanism behind every name a run can choose (strategies, perturbations, benchmarks, rewards, lab
tasks), and the plug-ins other packages add through entry points. Layer 0: no torch import.

A package adds a rule by registering it with the public decorators (`vepo_trl.register_strategy`, ...) in a module,
and naming that object under one of `GROUPS` in its metadata, as pytest and datasets plug-ins do::

    [project.entry-points."vepo_trl.strategies"]
    my_rule = "my_rules:my_rule"

The group is read once, when its registry is first read (never at import): loading the entry point imports the module,
whose decorator registers the rule under the entry point's name. A plug-in that fails to import, or registers a name
already taken, is kept as one line (package, entry point, error) that the registry raises where that name is asked for;
every other name, and every command that does not use it, works as before.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Generic, TypeVar


__all__ = [
    "GROUPS",
    "PluginError",
    "Registry",
    "call_with",
    "check_signature",
    "doc_summary",
    "keyword_settings",
    "plugin_entry_points",
    "plugin_names",
]

T = TypeVar("T")

# The entry-point group each plug-in registry reads
GROUPS = {
    "selection strategy": "vepo_trl.strategies",
    "perturbation": "vepo_trl.perturbations",
    "benchmark": "vepo_trl.benchmarks",
    "reward function": "vepo_trl.rewards",
}

# The package whose entry point is being loaded: what a registration made meanwhile is credited to
_LOADING: list[str] = []


class PluginError(ValueError):
    """A plug-in named on the command line (or in a recipe) that could not be loaded: one line that says which package,
    which entry point and what failed."""


@functools.cache
def _installed(group: str) -> tuple:
    """The installed entry points of `group`, read once a process: reading them scans every installed distribution
    (tens of ms), and a command's parse asks for a group's names at each value it checks."""
    from importlib.metadata import entry_points

    return tuple(entry_points(group=group))


def plugin_names(kind: str) -> tuple[str, ...]:
    """The names installed plug-ins declare for `kind`'s group, without importing any of them."""
    return tuple(point.name for point in _installed(GROUPS[kind])) if kind in GROUPS else ()


def plugin_entry_points() -> list[tuple[str, str, str, str, str]]:
    """(group, name, value, package, version) of every installed entry point in `GROUPS`, sorted: what the saved
    early-check tables are keyed on, so installing or removing a plug-in makes them again."""
    found = []
    for group in GROUPS.values():
        for point in _installed(group):
            dist = getattr(point, "dist", None)
            found.append((group, point.name, point.value, _package(point), getattr(dist, "version", "") or ""))
    return sorted(found)


def _package(point) -> str:
    """The distribution that declares `point`, else its module's top-level package."""
    return getattr(getattr(point, "dist", None), "name", None) or point.value.split(":")[0].split(".")[0]


class Registry(Mapping[str, T], Generic[T]):
    """Names to registered objects, read as a mapping. `kind` names the objects in messages ("selection strategy");
    a kind in `GROUPS` also takes plug-ins, loaded on the first read. `source(name)` is the package that registered
    `name` (`vepo_trl` for the built-in ones)."""

    def __init__(self, kind: str, *, plural: str | None = None):
        self.kind = kind
        self.plural = plural or f"{kind}s"
        self.group = GROUPS.get(kind)
        self._entries: dict[str, T] = {}
        self._sources: dict[str, str] = {}
        self._modules: dict[str, str] = {}  # the top-level module that registered each name
        self._broken: dict[str, str] = {}
        self._loaded = self.group is None

    # -- writing -----------------------------------------------------------------------------------------------------

    def add(self, name: str, value: T, *, module: str | None = None) -> T:
        """Register `value` under `name`; a name registered twice is an error (a typo cannot replace a rule)."""
        if not isinstance(name, str) or not name or name != name.strip():
            raise ValueError(f"A {self.kind} needs a non-empty name without surrounding spaces, got {name!r}.")
        if name in self._entries:
            raise ValueError(
                f"A {self.kind} named {name!r} is already registered (by {self._sources[name]}); choose another name."
            )
        top = (module or "").split(".")[0]
        self._entries[name] = value
        self._modules[name] = top
        # A plug-in being loaded is credited with what its own modules register, never with the built-ins a
        # vepo_trl module it imports for the first time registers meanwhile
        self._sources[name] = "vepo_trl" if top == "vepo_trl" else (_LOADING[-1] if _LOADING else top or "__main__")
        return value

    def __delitem__(self, name: str) -> None:
        if name not in self._entries:
            raise KeyError(name)
        self.pop(name)

    def pop(self, name: str, default=None):
        """Unregister `name` (a test's or a notebook's own registration, undone); its object, else `default`."""
        self._sources.pop(name, None)
        self._modules.pop(name, None)
        return self._entries.pop(name, default)

    # -- reading -----------------------------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> T:
        self.load_plugins()
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        self.load_plugins()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self.load_plugins()
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        self.load_plugins()
        return name in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"

    def lookup(self, name: str) -> T:
        """The object registered under `name`; else `PluginError` where a plug-in of that name failed to load, or
        `ValueError` listing the registered names."""
        if name in self:
            return self._entries[name]
        if name in self._broken:
            raise PluginError(self._broken[name])
        raise ValueError(f"Unknown {self.kind} {name!r}. Valid {self.plural}: {', '.join(sorted(self))}.")

    def source(self, name: str) -> str:
        """The package that registered `name`."""
        self.load_plugins()
        return self._sources[name]

    def registered_by(self, package: str) -> dict[str, T]:
        """What `package` registered, in order, without loading any plug-in (`vepo_trl`'s own: the names its help
        and documentation list)."""
        return {name: value for name, value in self._entries.items() if self._sources[name] == package}

    def broken(self) -> dict[str, str]:
        """The plug-ins that failed to load, by entry-point name: one line each."""
        self.load_plugins()
        return dict(self._broken)

    def broken_line(self, name: object) -> str | None:
        """Why `name` is not registered where a plug-in of that name failed to load, else None (a registered name:
        a plug-in that tried to take it does not hide it)."""
        return None if not isinstance(name, str) or name in self else self._broken.get(name)

    # -- plug-ins ----------------------------------------------------------------------------------------------------

    def load_plugins(self) -> None:
        """Load this registry's entry points, once. A failure is kept, not raised (see `lookup`)."""
        if self._loaded:
            return
        self._loaded = True  # before loading: a plug-in that reads this registry while it loads does not recurse
        for point in _installed(self.group):
            package = _package(point)
            where = f"the {self.kind} plug-in {point.name!r} ({package}: {point.name} = {point.value})"
            module = point.value.split(":")[0].split(".")[0]
            if point.name in self._entries and self._modules.get(point.name) == module:
                self._sources[point.name] = package  # registered already: imported by hand, or by another group
                continue
            with _crediting(package):
                try:
                    point.load()
                except Exception as error:  # noqa: BLE001 - any failure of someone else's code is that plug-in's
                    message = " ".join(str(error).split()) or type(error).__name__
                    self._broken[point.name] = f"{where} failed to load: {type(error).__name__}: {message}"
                    continue
            if point.name not in self._entries:
                self._broken[point.name] = f"{where} loaded, but registered no {self.kind} named {point.name!r}"
            elif self._modules[point.name] != module and self._sources[point.name] != package:
                self._broken[point.name] = (
                    f"{where} failed to load: the name {point.name!r} is taken by {self._sources[point.name]}"
                )


@contextmanager
def _crediting(package: str):
    _LOADING.append(package)
    try:
        yield
    finally:
        _LOADING.pop()


def doc_summary(obj) -> str:
    """The first paragraph of `obj`'s docstring on one line: what listings show of a registered function."""
    paragraph = (inspect.getdoc(obj) or "").split("\n\n", 1)[0]
    return " ".join(paragraph.split())


# ---------------------------------------------------------------------------------------------------------------------
# A registered function's own settings
# ---------------------------------------------------------------------------------------------------------------------


def keyword_settings(fn: Callable) -> dict[str, object]:
    """The keyword-only parameters of `fn` (what it reads), each with its default (`inspect.Parameter.empty` where it
    has none)."""
    return {
        p.name: p.default
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def check_signature(fn: Callable, kind: str, positional: tuple[str, ...]) -> None:
    """A registered function takes `positional` first and declares every setting after `*` (keyword-only), so what it
    reads is what it declares: `def rule(signals, mask, *, ratio, threshold=0.5)`."""
    parameters = inspect.signature(fn).parameters.values()
    takes = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    loose = takes[len(positional) :]
    if loose or (len(takes) < len(positional) and not any(p.kind is p.VAR_POSITIONAL for p in parameters)):
        raise TypeError(
            f"A {kind} is `def {getattr(fn, '__name__', 'fn')}({', '.join(positional)}, *, <settings>)`: "
            + (
                f"declare {', '.join(loose)} after `*`"
                if loose
                else f"it takes {len(positional)} positional arguments"
            )
            + "."
        )


@functools.cache
def _declared(fn: Callable) -> frozenset[str] | None:
    """The keywords `fn` takes, or None where it takes `**kwargs` (any): read once per function."""
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def call_with(fn: Callable, *args, **available):
    """`fn(*args, **available)`, passing only the keywords `fn` declares (all of them where it takes `**kwargs`): a
    registered function names what it reads, and needs no `**_` for the rest."""
    names = _declared(fn)
    if names is not None:
        available = {key: value for key, value in available.items() if key in names}
    return fn(*args, **available)
