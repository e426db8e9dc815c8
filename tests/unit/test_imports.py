"""The packages under ``src/databus`` import one way, and no module imports itself back.

Every import statement is read with :mod:`ast`: at module level, inside functions and
classes, under ``if TYPE_CHECKING:``, absolute and relative. An import moved into a
function or behind ``TYPE_CHECKING`` still ties two modules together, so it counts.
Imports made with :func:`importlib.import_module` (the lazy names of
``databus.client`` and ``databus.spark``) are not seen; both packages also name
those modules under ``TYPE_CHECKING``, which is.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

# -- the rule ------------------------------------------------------------------------------
#
#   core <- buffer <- sources <- relay      capture a database, serve its changes (relay
#                                           also on coord: cluster membership)
#   core <- coord                           ZooKeeper: cluster addresses, members, epochs
#   core, coord <- client                   read relays over HTTP (client.sinks included)
#   core <- serving                         the HTTP server plumbing of relay and bootstrap
#   client <- bootstrap, spark              consumers: through client, never relay or buffer
#   client <- kafka                         the publisher (relay -> Kafka) is a client too
#   client <- binlog                        the binlog service reads relays as a client
#
# A package is databus.<first name>; top-level modules (cli.py) are packages of their own.
# A package may import itself and what its row lists. A new package fails the test until
# it is given a row.
ANY = frozenset({"*"})  # entry points: they wire the parts together
ALLOWED: dict[str, frozenset[str]] = {
    # package     may import
    "core":       frozenset(),
    "buffer":     frozenset({"core"}),
    "sources":    frozenset({"core", "buffer", "client"}),  # client: a chain relay's source
    "relay":      frozenset({"core", "buffer", "sources", "serving",
                             "coord"}),  # coord: a cluster member's election and fencing
    "serving":    frozenset({"core", "auth"}),
    "auth":       frozenset({"core"}),  # server side of tokens: the token file, checking
    "client":     frozenset({"core", "coord"}),  # coord: members of a zk:// cluster address
    "coord":      frozenset({"core"}),  # ZooKeeper: cluster addresses, members, epochs
    "bootstrap":  frozenset({"core", "client", "serving",
                             "sources"}),  # sources: the initial load reads the source db
    "spark":      frozenset({"core", "client", "bootstrap",  # bootstrap: the snapshot reader
                             "javadeps"}),  # javadeps: the Delta and Iceberg jars
    "kafka":      frozenset({"core", "client",
                             "databus"}),  # databus: __version__ in each message's source
    "javadeps":   frozenset({"core"}),
    "binlog":     frozenset({"core", "client",
                             "serving"}),  # serving: TlsServerConfig of its MySQL port
    "databus":    frozenset({"core"}),  # databus/__init__.py re-exports the core words
    "cli":        ANY,
    "demo":       ANY,
    "__main__":   ANY,
}

# Edges that break the rule today and are being removed; each line says when. (Empty:
# the last one, sources -> relay for SourceConfig, went when it moved to sources.)
TEMPORARY: set[tuple[str, str]] = set()

ROOT = Path(__file__).resolve().parents[2] / "src"


# -- reading the imports ------------------------------------------------------------------

@dataclass(frozen=True)
class Edge:
    source: str  # importing module, e.g. "databus.relay.relay"
    target: str  # imported module, e.g. "databus.buffer"
    line: int
    where: str  # "module", "function" or "TYPE_CHECKING"

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} (line {self.line}, {self.where} level)"


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under ``root/databus``: Python files and the
    C extensions' sources (``buffer/_select.c`` is ``databus.buffer._select``)."""
    out: dict[str, Path] = {}
    files = [*(root / "databus").rglob("*.py"), *(root / "databus").rglob("*.c")]
    for path in sorted(files):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, text: str, known: set[str], *, is_package: bool) -> list[Edge]:
    """The imports of module ``name`` (source ``text``) that name a module in ``known``."""
    tree = ast.parse(text)
    package = name if is_package else name.rpartition(".")[0]
    out: list[Edge] = []

    def resolve(mod: str, level: int) -> str:
        if level == 0:
            return mod
        base = package.split(".")
        if level > 1:
            base = base[: -(level - 1)]
        return ".".join([*base, mod] if mod else base)

    def add(target: str, node: ast.stmt, where: str) -> None:
        # the longest known module the dotted name starts with ("databus.x.y.Name" -> "databus.x.y")
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.append(Edge(name, target, node.lineno, where))

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child, where)
            elif isinstance(child, ast.ImportFrom):
                mod = resolve(child.module or "", child.level)
                for alias in child.names:
                    # "from pkg import sub" imports the module pkg.sub when there is one
                    add(f"{mod}.{alias.name}", child, where)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), "TYPE_CHECKING")
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), where)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, "function")
            else:
                visit(child, where)

    visit(tree, "module")
    return out


def all_edges(root: Path = ROOT) -> list[Edge]:
    modules = module_names(root)
    known = set(modules)
    edges: list[Edge] = []
    for name, path in modules.items():
        if path.suffix != ".py":
            continue
        edges += imports_of(name, path.read_text(encoding="utf-8"), known,
                            is_package=path.name == "__init__.py")
    return edges


def layer(module: str) -> str:
    """``databus.relay.app`` -> ``relay``; ``databus`` -> ``databus``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def forbidden(edges: list[Edge]) -> list[str]:
    problems = []
    for e in edges:
        src, dst = layer(e.source), layer(e.target)
        allowed = ALLOWED.get(src)
        if allowed is None:
            problems.append(f"{e}: package {src!r} is not in ALLOWED; give it its row")
        elif src != dst and allowed is not ANY and dst not in allowed \
                and (src, dst) not in TEMPORARY:
            may = ", ".join(sorted(allowed)) or "nothing"
            problems.append(f"{e}: {src} may import only {may}")
    return problems


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan), as one cycle each."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(_one_cycle(graph, set(group)))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return groups


def _one_cycle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest cycle through the group's first module (for the message)."""
    start = min(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & group):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    raise AssertionError(f"no cycle through {start}")  # unreachable for a strong component


# -- the tests ----------------------------------------------------------------------------

def test_every_package_imports_only_the_layers_below_it() -> None:
    problems = forbidden(all_edges())
    assert not problems, "forbidden imports (see ALLOWED in this test):\n" + "\n".join(problems)


def describe(cycle: list[str], edges: list[Edge]) -> str:
    """``a -> b (line 3, module level) -> a (line 9, function level)``."""
    first: dict[tuple[str, str], Edge] = {}
    for e in edges:
        first.setdefault((e.source, e.target), e)
    steps = [cycle[0]]
    for src, dst in pairwise(cycle):
        e = first[(src, dst)]
        steps.append(f"{dst} (line {e.line}, {e.where} level)")
    return " -> ".join(steps)


def test_no_module_imports_itself_back() -> None:
    edges = all_edges()
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(describe(c, edges) for c in found)


def test_temporary_exceptions_are_still_needed() -> None:
    """A TEMPORARY edge that no import uses any more is deleted from the table."""
    used = {(layer(e.source), layer(e.target)) for e in all_edges()}
    assert used >= TEMPORARY, f"no longer imported, delete from TEMPORARY: {TEMPORARY - used}"


def test_the_scanner_sees_every_kind_of_import() -> None:
    known = {"databus", "databus.relay", "databus.relay.app", "databus.relay.relay",
             "databus.buffer", "databus.core", "databus.core.event", "databus.client"}
    text = (
        "from __future__ import annotations\n"
        "import json\n"
        "from typing import TYPE_CHECKING\n"
        "import databus.core.event\n"          # absolute, dotted
        "from . import app\n"                  # relative, a sibling module
        "from ..buffer import EventBuffer\n"   # relative, a name of a package
        "if TYPE_CHECKING:\n"
        "    from databus.client import Thing\n"
        "def f() -> None:\n"
        "    from databus.core import event\n"  # function level
        "class C:\n"
        "    def m(self) -> None:\n"
        "        import databus.relay.app as a\n"
    )
    edges = imports_of("databus.relay.relay", text, known, is_package=False)
    assert [(e.target, e.line, e.where) for e in edges] == [
        ("databus.core.event", 4, "module"),
        ("databus.relay.app", 5, "module"),
        ("databus.buffer", 6, "module"),
        ("databus.client", 8, "TYPE_CHECKING"),
        ("databus.core.event", 10, "function"),
        ("databus.relay.app", 13, "function"),
    ]
    assert forbidden([Edge("databus.client.x", "databus.relay.app", 3, "function")]) == [
        "databus.client.x -> databus.relay.app (line 3, function level): "
        "client may import only coord, core"]
    assert cycles([Edge("databus.a", "databus.b", 1, "module"),
                   Edge("databus.b", "databus.c", 1, "function"),
                   Edge("databus.c", "databus.a", 1, "TYPE_CHECKING"),
                   Edge("databus.c", "databus.d", 1, "module")]) == [
        ["databus.a", "databus.b", "databus.c", "databus.a"]]


def test_the_real_tree_is_read() -> None:
    """Guards against a scanner that silently finds nothing."""
    edges = {(e.source, e.target) for e in all_edges()}
    assert ("databus.relay.relay", "databus.buffer") in edges
    assert len(module_names(ROOT)) > 50
