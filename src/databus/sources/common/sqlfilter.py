"""Row filters from outside (``additional-conditions`` of an ``execute-snapshot``
signal), parsed with a real SQL parser (sqlglot) and emitted from the parsed tree.

A filter is accepted only if it is ONE boolean expression over the table's own
columns, literals, comparison and logic operators (``= <> != < <= > >= AND OR NOT IS
[NOT] NULL IN (...) BETWEEN LIKE``), arithmetic and the pure functions in
:data:`FUNCTIONS`. Everything else (subqueries, other tables or qualified columns,
variables, comments, several statements, hex or bit literals, any other function:
``SLEEP``, ``BENCHMARK``, ``LOAD_FILE`` ...) is a :class:`InvalidRequestError` that
names the rejected part. The SQL that reaches the database is generated from the tree
(MySQL dialect), never copied from the input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from databus.core.errors import InvalidRequestError

FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.Lower: "LOWER", exp.Upper: "UPPER", exp.Length: "LENGTH", exp.Abs: "ABS",
    exp.Coalesce: "COALESCE", exp.Trim: "TRIM", exp.Substring: "SUBSTRING",
    exp.Year: "YEAR", exp.Month: "MONTH", exp.Day: "DAY", exp.Round: "ROUND",
    exp.TsOrDsToDate: "DATE",  # how sqlglot reads MySQL's DATE() (and YEAR()'s argument)
}
"""The pure functions a filter may call."""

_PREDICATES = (exp.And, exp.Or, exp.Not, exp.Paren, exp.EQ, exp.NEQ, exp.GT, exp.GTE,
               exp.LT, exp.LTE, exp.Is, exp.In, exp.Between, exp.Like, exp.Boolean)
_VALUES = (exp.Literal, exp.Null, exp.Boolean, exp.Identifier, exp.Neg, exp.Add, exp.Sub,
           exp.Mul, exp.Div, exp.Mod, exp.Column, exp.Tuple)


def safe_filter(text: str, table: str, columns: Iterable[str], *,
                dialect: str = "mysql") -> str:
    """The filter ``text`` for ``table`` (``db.table``) as SQL generated from its parse
    tree, or :class:`InvalidRequestError` naming what is not allowed. ``dialect``:
    sqlglot's name of the SQL read and written (the PostgreSQL source: ``postgres``)."""
    known = {c.lower() for c in columns}
    bare = _outside_strings(text)
    if "--" in bare or "/*" in bare or "#" in bare:
        raise InvalidRequestError(f"filter for {table}: comments are not allowed")
    try:
        statements = [s for s in sqlglot.parse(text, read=dialect) if s is not None]
    except ParseError as exc:
        raise InvalidRequestError(f"filter for {table} is not valid SQL: {exc}") from exc
    if len(statements) != 1:
        raise InvalidRequestError(f"filter for {table} must be one expression, got"
                                  f" {len(statements)} statements")
    tree = statements[0]
    if not isinstance(tree, _PREDICATES):
        raise InvalidRequestError(f"filter for {table} must be a condition (true or false),"
                                  f" not {type(tree).__name__}")
    for node in tree.walk():
        if node.comments:
            raise InvalidRequestError(f"filter for {table}: comments are not allowed")
        if isinstance(node, exp.Column):
            if node.table or node.db or node.catalog:
                raise InvalidRequestError(
                    f"filter for {table}: {node.sql(dialect='mysql')} names another table;"
                    " use the table's own column names")
            if node.name.lower() not in known:
                raise InvalidRequestError(
                    f"filter for {table}: {node.name!r} is not a column of {table}")
        elif isinstance(node, exp.In) and node.args.get("query") is not None:
            raise InvalidRequestError(f"filter for {table}: subqueries are not allowed")
        elif type(node) in FUNCTIONS:
            continue
        elif not isinstance(node, _PREDICATES + _VALUES):
            raise InvalidRequestError(
                f"filter for {table}: {node.sql(dialect='mysql')[:60]!r}"
                f" ({type(node).__name__}) is not allowed; allowed: the table's columns,"
                " literals, comparisons, AND/OR/NOT, IS NULL, IN, BETWEEN, LIKE, arithmetic"
                f" and {', '.join(sorted(FUNCTIONS.values()))}")
    return tree.sql(dialect=dialect)


def checked_conditions(data: dict[str, Any], *, wanted: Callable[[str], bool],
                       columns: Callable[[str, str], list[str]], dialect: str = "mysql",
                       qualifier: str = "db") -> dict[str, Any]:
    """A snapshot signal's ``data`` with each ``additional-conditions`` filter parsed
    against its table's columns and written again from the parse tree
    (:func:`safe_filter`); InvalidRequestError (400) for anything else, so a stored
    signal row only ever holds SQL generated here.

    ``wanted(table)`` says whether ``qualifier.table`` is captured; ``columns(qualifier,
    name)`` lists the table's columns (empty: no such table).
    """
    conditions = data.get("additional-conditions")
    if conditions is None:
        return data
    if not isinstance(conditions, list):
        raise InvalidRequestError("additional-conditions must be a list")
    checked = []
    for c in conditions:
        if not isinstance(c, dict) or not isinstance(c.get("data-collection"), str) \
                or not isinstance(c.get("filter"), str):
            raise InvalidRequestError("additional-conditions entries need a data-collection"
                                      f" ({qualifier}.table) and a filter, both strings")
        table = c["data-collection"]
        outer, _, name = table.partition(".")
        if not name or not wanted(table):
            raise InvalidRequestError(f"additional-conditions: {table!r} is not a captured"
                                      f" table ({qualifier}.table)")
        cols = columns(outer, name)
        if not cols:
            raise InvalidRequestError(f"additional-conditions: table {table} does not exist")
        checked.append({"data-collection": table,
                        "filter": safe_filter(c["filter"], table, cols, dialect=dialect)})
    return {**data, "additional-conditions": checked}


def _outside_strings(text: str) -> str:
    """``text`` without its quoted parts (so a '#' inside a string literal is fine)."""
    out, quote, i = [], "", 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        else:
            out.append(ch)
        i += 1
    return "".join(out)
