"""trnlab's imports read one way: each at the top of its module, and the graph of them has no cycle.

Read from the source (``ast``), so a cycle or an import hidden in a function fails here before it
confuses a reader. Names that moved to another module resolve by name when used
(:func:`trnlab.deprecation.moved_names`, like ``trnlab.X`` itself): they are no imports, and the
last test checks that every one of them still resolves.
"""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import trnlab

PACKAGE = Path(trnlab.__file__).parent
MODULES = {".".join(("trnlab", *p.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): p
           for p in sorted(PACKAGE.rglob("*.py"))}
#: Modules that look names up by a string: the lazy top level, the command table, moved names.
NAME_LOOKUPS = {"trnlab", "trnlab.__main__", "trnlab.deprecation"}


def _module_of(name: str) -> str:
    """The trnlab module a dotted import name lands in (``trnlab.bench.workload.run`` -> ``trnlab.bench.workload``)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str) -> tuple[set[str], list[tuple[str, int]]]:
    """``(modules imported at the top, [(module, line)] imported inside a function or class)``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top, nested = set(), []

    def targets(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:
            parent = package
            for _ in range(node.level - 1):
                parent = parent.rpartition(".")[0]
            base = f"{parent}.{base}" if base else parent
        return [f"{base}.{a.name}" for a in node.names]

    def visit(node, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for name in targets(child):
                    if name == "trnlab" or name.startswith("trnlab."):
                        found = _module_of(name)
                        if found != module:
                            (nested.append((found, child.lineno)) if inside else top.add(found))
            visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)))

    visit(ast.parse(path.read_text()), False)
    return top, nested


GRAPH = {module: _imports(module) for module in MODULES}


def test_every_trnlab_import_is_at_the_top_of_its_module():
    nested = [f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {target}"
              for m, (_, inside) in GRAPH.items() for target, line in inside]
    assert not nested, "move these imports to the top of their module:\n" + "\n".join(nested)


def find_cycle(edges: dict[str, set[str]]) -> list[str]:
    """A cycle of ``edges`` (``[a, b, a]``), or ``[]`` when there is none."""
    state, path = {}, []

    def walk(module) -> list[str]:
        state[module] = "open"
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (cycle := walk(target)):
                return cycle
        path.pop()
        state[module] = "done"
        return []

    for module in sorted(edges):
        if module not in state and (cycle := walk(module)):
            return cycle
    return []


def test_the_import_graph_has_no_cycle():
    # Importing trnlab.a.b also runs the package trnlab.a first: an edge to every parent package,
    # except a module's own (a package's __init__ may import its submodules).
    edges = {m: {p for t in top for p in _with_parents(t)} - set(_with_parents(m)) for m, (top, _) in GRAPH.items()}
    assert find_cycle(edges) == [], "import cycle: " + " -> ".join(find_cycle(edges))
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check can fail


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts) + 1)]


def _imports_by_string(path: Path) -> list[int]:
    """Lines calling ``import_module`` with anything but a literal third-party name."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and not (node.args and isinstance(node.args[0], ast.Constant) and not node.args[0].value.startswith("trnlab"))]


def test_only_the_name_lookups_import_by_string():
    by_string = {m: lines for m, p in MODULES.items() if m not in NAME_LOOKUPS and (lines := _imports_by_string(p))}
    assert not by_string, f"import these at the top instead of by name: {by_string}"


def test_a_cycle_or_a_nested_import_would_be_found(tmp_path):
    # The checks above can fail: an import inside a function is seen, and so is a two-module cycle.
    global MODULES
    saved = MODULES
    (tmp_path / "a.py").write_text("from trnlab import b\n")
    (tmp_path / "b.py").write_text("import importlib\ndef f():\n    import trnlab.a\n    importlib.import_module('trnlab.a')\n")
    try:
        MODULES = {"trnlab.a": tmp_path / "a.py", "trnlab.b": tmp_path / "b.py"}
        assert _imports("trnlab.a") == ({"trnlab.b"}, [])
        assert _imports("trnlab.b") == (set(), [("trnlab.a", 3)])
        assert _imports_by_string(tmp_path / "b.py") == [4]
    finally:
        MODULES = saved


def test_every_moved_name_still_resolves():
    checked = 0
    for module in MODULES:
        # Scripts run when imported; trnlab.launch is a deprecated module (importing it would shadow trnlab.launch).
        if ".scripts" in module or module.endswith("__main__") or module == "trnlab.launch":
            continue
        getter = getattr(importlib.import_module(module), "__getattr__", None)
        for name, target in getattr(getter, "moved", {}).items():
            target = target[0] if isinstance(target, tuple) else target
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                assert getter(name) is getattr(importlib.import_module(target), name), f"{module}.{name}"
            checked += 1
    assert checked >= 40  # planning's, generation's, training's and launcher's old names
