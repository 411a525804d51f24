"""Imports point downward, and module-level imports form no cycle.

The layers, lowest first (a module may import its own layer and the layers below it)::

    0 foundation  m2mwire.errors (the exception hierarchy every layer raises) and
                  m2mwire.schemas.avp_pb2 (generated protobuf code): modules that import nothing
                  from m2mwire, which this test also asserts, so they can never close a cycle
    1 codecs      m2mwire.codecs.*      pure encoders and decoders
    2 schemas     m2mwire.schemas.*     the session protocol's messages and identities
    3 session     m2mwire.session.*     the sans-I/O session core
    4 transport   m2mwire.transport.*   WebSocket, QUIC and NATS channels
    5 shell       m2mwire.shell.* and m2mwire's other top-level modules (api, gateway, options, ...)
    6 app         m2mwire.cli, m2mwire.demo, m2mwire.__main__

Every import statement counts, at module level (``if TYPE_CHECKING:`` blocks included) and inside
functions: a function-level import is still a dependency, only a deferred one. So the cycle check
covers them too: a cycle closed by a deferred import (``codecs.avp`` <-> ``codecs.kvcache`` did
that) still means two modules that cannot be understood, tested or loaded one without the other.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "m2mwire"

FOUNDATION = frozenset({"m2mwire.errors", "m2mwire.schemas.avp_pb2"})
LAYERS = {"codecs": 1, "schemas": 2, "session": 3, "transport": 4, "shell": 5}
APP = frozenset({"m2mwire.cli", "m2mwire.demo", "m2mwire.__main__"})
NAMES = ("foundation", "codecs", "schemas", "session", "transport", "shell", "app")


def layer(module: str) -> int:
    if module in FOUNDATION:
        return 0
    if module in APP:
        return 6
    parts = module.split(".")
    # m2mwire itself and its top-level modules are the shell
    return LAYERS.get(parts[1], 5) if len(parts) > 1 else 5


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    runtime: bool  # module level, outside TYPE_CHECKING: runs when the source is imported
    path: Path

    def describe(self) -> str:
        src, dst = layer(self.source), layer(self.target)
        where = self.path.relative_to(PACKAGE.parent)
        when = "" if self.runtime else " (deferred: in a function or TYPE_CHECKING)"
        return f"{where}:{self.line}: {self.source} ({NAMES[src]}) imports {self.target} ({NAMES[dst]}){when}"


def module_names() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement, with whether it runs at import time."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, runtime: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append((child, runtime))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), False)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), runtime)
            else:
                visit(child, runtime)  # class bodies, try/with/if blocks run at import time

    visit(tree, True)
    return found


def edges() -> list[Edge]:
    modules = module_names()
    out: list[Edge] = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, runtime in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base_parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # `from pkg import sub` imports the submodule pkg.sub when there is one.
                subs = [f"{base}.{alias.name}" for alias in node.names]
                targets = [sub for sub in subs if sub in modules or _extension(sub)] or [base]
                if len(targets) < len(subs) and base not in targets:
                    targets.append(base)  # some names are attributes of base itself
            for target in targets:
                if target == "m2mwire" or target.startswith("m2mwire."):
                    out.append(Edge(name, target, node.lineno, runtime, path))
    return out


def _extension(module: str) -> bool:
    """A compiled module (m2mwire.codecs._varint): a file that is not .py."""
    parts = module.split(".")
    folder = PACKAGE.parent.joinpath(*parts[:-1])
    return any(folder.glob(parts[-1] + ".*.so")) or (folder / (parts[-1] + ".pyi")).exists()


def test_every_module_has_a_layer() -> None:
    # A new top-level package must be placed explicitly (layer() would call it shell).
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages <= set(LAYERS), f"place these packages in LAYERS: {sorted(packages - set(LAYERS))}"


def test_foundation_imports_nothing_from_m2mwire() -> None:
    bad = [e.describe() for e in edges() if e.source in FOUNDATION]
    assert not bad, "the foundation layer must import nothing from m2mwire:\n" + "\n".join(bad)


def test_imports_point_downward() -> None:
    upward = [e.describe() for e in edges() if layer(e.target) > layer(e.source)]
    assert not upward, (
        "imports of a higher layer (order: " + " < ".join(NAMES) + "); move the shared piece down "
        "or the importer up:\n" + "\n".join(sorted(upward))
    )


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components with more than one module (or a self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return found


def test_imports_have_no_cycle() -> None:
    """No cycle, whether its imports run at module level or are deferred."""
    all_edges = [e for e in edges() if e.source != e.target]
    graph: dict[str, set[str]] = {}
    for e in all_edges:
        graph.setdefault(e.source, set()).add(e.target)
    cycles = strongly_connected(graph)
    lines = []
    for component in cycles:
        members = set(component)
        lines.append("cycle among " + ", ".join(component) + ":")
        lines += ["  " + e.describe() for e in all_edges if e.source in members and e.target in members]
    assert not cycles, "import cycles:\n" + "\n".join(lines)


def test_the_checker_sees_every_kind_of_import() -> None:
    """The scanner itself: function-level, TYPE_CHECKING and relative imports are all found."""
    found = {(e.source, e.target, e.runtime) for e in edges()}
    # function level (the client imports the QUIC transport when open_quic_connection() is called)
    assert ("m2mwire.shell.client", "m2mwire.transport.entries.quic", False) in found
    # `from m2mwire import tracing` is the submodule, not the package
    assert ("m2mwire.shell.session", "m2mwire.tracing", True) in found
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert layer("m2mwire.transport.nats.bus") == 4 and layer("m2mwire.shell.gateway") == 5
