"""MkDocs hook: the tables the registries make, filled in where a page says `<!-- table: module.function -->`, so a
new family (or anything else a registry lists) changes no page: the site shows the registry as the package has it."""

import importlib
import re


MARKER = re.compile(r"<!-- table: ([\w.]+) -->\n")


def fill(markdown: str) -> str:
    """`markdown` with the output of each marked function after its marker."""

    def table(match) -> str:
        module, name = match.group(1).rsplit(".", 1)
        return match.group(0) + getattr(importlib.import_module(module), name)()

    return MARKER.sub(table, markdown)


def on_page_markdown(markdown, page, config, files):
    return fill(markdown)
