"""Command-line options are settings of the config models they configure.

Every option of a command that configures a component names the model field it sets,
in a table per command (:data:`Flags`: parameter name -> dotted field path in the
command's model, e.g. ``"port": "http.port"``). An option not given is None and sets
nothing, so the model's default applies (no default is restated here); an option
given sets its field, over what a ``--config`` file says. A value that does not fit its
model (a MySQL-only setting on a SQLite source, a bad port) is refused by the model
with the field's name. ``tests/unit/test_cli_flags.py`` checks every option of every
command against its table and its model, and that each one given with a config file
is applied or refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

Flags = Mapping[str, str]
"""Parameter name of a command's option -> the dotted path of the field it sets."""


def settings(values: Mapping[str, Any], flags: Flags) -> dict[str, Any]:
    """The nested settings the given options make: for each option of ``flags`` whose
    value in ``values`` is not None, its field path set to the value (paths as strings:
    the models parse them)."""
    out: dict[str, Any] = {}
    for param, path in flags.items():
        value = values.get(param)
        if value is None:
            continue
        *parents, leaf = path.split(".")
        section = out
        for p in parents:
            section = section.setdefault(p, {})
        section[leaf] = str(value) if isinstance(value, Path) else value
    return out


def csv(value: str | None) -> list[str] | None:
    """Comma-separated names; None when the option was not given."""
    if value is None:
        return None
    return [p.strip() for p in value.split(",") if p.strip()]


def regexes(value: str | None) -> list[str] | None:
    """Comma-separated regexes; a comma inside braces, brackets or parentheses belongs
    to its regex (``x{1,3}``, ``[a,b]``), and ``\\,`` is a literal comma. None when the
    option was not given."""
    if value is None:
        return None
    out: list[str] = []
    part, depth, escaped = "", 0, False
    for ch in value:
        if escaped:
            part, escaped = part + ch, False
            continue
        if ch == "\\":
            part, escaped = part + ch, True
            continue
        if ch in "{[(":
            depth += 1
        elif ch in "}])" and depth:
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(part)
            part = ""
            continue
        part += ch
    out.append(part)
    return [p.strip() for p in out if p.strip()]
