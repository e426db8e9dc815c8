"""Rules of the house for ``src/databus`` (docs/architecture.md), read from the source
with :mod:`ast`:

* a broad ``except`` (``Exception``, ``BaseException``) re-raises after its cleanup, or
  says on its line (or the comment lines just above) why it is broad: ``# broad: ...``;
* a package ``__init__.py`` only hands names on: a docstring, imports (also under
  ``TYPE_CHECKING``), ``__all__``, ``__version__`` and a ``lazy_names`` ``__getattr__``;
* no module is longer than 600 lines.

``TEMPORARY`` lists the files that break a rule today and are being fixed by their
owners (issue 31); a file leaves it once it keeps the rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "databus"
MAX_LINES = 600
BROAD = frozenset({"Exception", "BaseException"})

# (rule, file relative to src/databus): broken today, being fixed (issue 31)
TEMPORARY: set[tuple[str, str]] = set()


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _is_broad(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id in BROAD for k in kinds)


def _reraises(handler: ast.ExceptHandler) -> bool:
    last = handler.body[-1]
    return isinstance(last, ast.Raise) and last.exc is None


def _says_why(lines: list[str], lineno: int) -> bool:
    """``# broad:`` on the ``except`` line, or in the comment lines right above it."""
    if "# broad:" in lines[lineno - 1]:
        return True
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        if "# broad:" in lines[i]:
            return True
        i -= 1
    return False


def broad_excepts_without_reason(text: str, name: str) -> list[str]:
    """The broad handlers of module ``name`` (source ``text``) that neither re-raise nor
    say why."""
    lines = text.splitlines()
    return [f"{name}:{node.lineno}: {lines[node.lineno - 1].strip()}"
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.ExceptHandler) and node.type is not None
            and _is_broad(node) and not _reraises(node) and not _says_why(lines, node.lineno)]


def _hands_on(stmt: ast.stmt, first: bool) -> bool:
    if first and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return True  # the docstring
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return True
    if isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Name) \
            and stmt.test.id == "TYPE_CHECKING":
        return all(isinstance(s, ast.Import | ast.ImportFrom) for s in stmt.body) \
            and not stmt.orelse
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
            and isinstance(stmt.targets[0], ast.Name):
        target, value = stmt.targets[0].id, stmt.value
        if target == "__getattr__":
            return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
                and value.func.id == "lazy_names"
        return target in ("__all__", "__version__") and isinstance(
            value, ast.List | ast.Tuple | ast.Constant)
    return False


def init_definitions(text: str, name: str) -> list[str]:
    """The statements of package ``__init__`` ``name`` (source ``text``) that do more
    than hand names on."""
    return [f"{name}:{stmt.lineno}: {type(stmt).__name__}"
            for i, stmt in enumerate(ast.parse(text).body) if not _hands_on(stmt, i == 0)]


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_every_broad_except_reraises_or_says_why() -> None:
    bad = [line for path in _modules() if ("except", _name(path)) not in TEMPORARY
           for line in broad_excepts_without_reason(_read(path), _name(path))]
    assert not bad, ("catch the specific errors, re-raise after the cleanup, or say why on"
                     " the line (# broad: ...):\n" + "\n".join(bad))


def test_package_inits_only_hand_names_on() -> None:
    bad = [line for path in _modules() if path.name == "__init__.py"
           and ("init", _name(path)) not in TEMPORARY
           for line in init_definitions(_read(path), _name(path))]
    assert not bad, ("an __init__ only hands names on (docs/architecture.md); move these"
                     " to a module of the package:\n" + "\n".join(bad))


def lazy_tables(text: str) -> tuple[set[str], set[tuple[str, str]], set[tuple[str, str]]]:
    """``__all__``, the (module, name) pairs of a ``lazy_names`` table and those imported
    under ``TYPE_CHECKING``, from a package ``__init__``'s source."""
    names: set[str] = set()
    table: set[tuple[str, str]] = set()
    typed: set[tuple[str, str]] = set()
    for stmt in ast.parse(text).body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            target = stmt.targets[0].id
            if target == "__all__":
                names = set(ast.literal_eval(stmt.value))
            elif target == "__getattr__" and isinstance(stmt.value, ast.Call):
                table = {(m, n) for m, ns in ast.literal_eval(stmt.value.args[1]).items()
                         for n in ns}
        elif isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Name):
            typed = {(i.module or "", a.name) for i in stmt.body
                     if isinstance(i, ast.ImportFrom) for a in i.names}
    return names, table, typed


def test_lazy_names_are_the_names_handed_on() -> None:
    """A lazy package hands on exactly ``__all__``, from the modules it names to type
    checkers: the three lists cannot drift apart."""
    lazy = [p for p in _modules() if p.name == "__init__.py" and "lazy_names(" in _read(p)]
    assert {_name(p) for p in lazy} >= {"client/__init__.py", "spark/__init__.py"}
    for path in lazy:
        names, table, typed = lazy_tables(_read(path))
        assert {n for _, n in table} == names, _name(path)
        assert table == typed, _name(path)


def test_no_module_is_longer_than_600_lines() -> None:
    bad = [f"{_name(p)}: {n} lines" for p in _modules()
           if ("lines", _name(p)) not in TEMPORARY
           and (n := len(_read(p).splitlines())) > MAX_LINES]
    assert not bad, "split by concept (one module per concept):\n" + "\n".join(bad)


def test_the_rules_see_what_they_forbid() -> None:
    """Each check finds a breach of its rule (the tests above could not fail otherwise)."""
    module = ("try:\n    pass\nexcept Exception:\n    pass\n"
              "try:\n    pass\nexcept (ValueError, BaseException):\n    log()\n"
              "try:\n    pass\nexcept Exception:  # broad: a thread's top\n    pass\n"
              "try:\n    pass\n# broad: the comment above\nexcept Exception:\n    pass\n"
              "try:\n    pass\nexcept BaseException:\n    close()\n    raise\n"
              "try:\n    pass\nexcept OSError:\n    pass\n")
    assert [line.split(":")[1] for line in broad_excepts_without_reason(module, "m.py")] == [
        "3", "7"]
    init = ('"""doc."""\nfrom x import y\n__all__ = ["y"]\n'
            "__getattr__ = lazy_names(__name__, {})\n"
            "def helper() -> None:\n    pass\nCONSTANT = 3\n")
    assert [line.rsplit(": ", 1)[1] for line in init_definitions(init, "__init__.py")] == [
        "FunctionDef", "Assign"]
