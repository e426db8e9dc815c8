"""``--tables`` takes comma-separated regexes: a comma inside a regex's braces,
brackets or parentheses stays in that regex (a token granted ``shop\\.t{1,3}`` must
not become two broken patterns)."""

from __future__ import annotations

import re

import pytest

from databus.cli.flags import regexes


@pytest.mark.parametrize(("given", "want"), [
    ("customers,orders", ["customers", "orders"]),
    (r"shop\..*", [r"shop\..*"]),
    (r"shop\.t{1,3}, other\..*", [r"shop\.t{1,3}", r"other\..*"]),
    ("[a,b]x,(p|q,r)", ["[a,b]x", "(p|q,r)"]),
    (r"a\,b,c", [r"a\,b", "c"]),
    ("", []),
    (" , ,", []),
])
def test_table_regexes_split_only_at_top_level_commas(given: str, want: list[str]) -> None:
    got = regexes(given)
    assert got == want
    for p in got:
        re.compile(p)
