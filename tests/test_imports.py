"""trnlab's imports read one way: each at the top of its module, and the graph of them has no cycle.

Read from the source (``ast``), so a cycle or an import hidden in a function fails here before it
confuses a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import trnlab

PACKAGE = Path(trnlab.__file__).parent
MODULES = {".".join(("trnlab", *p.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): p
           for p in sorted(PACKAGE.rglob("*.py"))}
#: Modules that look names up by a string: the lazy top level and the command table.
# The lazy top level, the command line, and the torch entry point that loads the stand-in only when asked.
NAME_LOOKUPS = {"trnlab", "trnlab.__main__", "trnlab._standin_entry"}


def _module_of(name: str, modules=None) -> str:
    """The trnlab module a dotted import name lands in (``trnlab.bench.workload.run`` -> ``trnlab.bench.workload``;
    ``trnlab.packed_dataset``, a lazy top-level name, -> ``trnlab.training``)."""
    modules = MODULES if modules is None else modules
    head, _, last = name.rpartition(".")
    lazy = trnlab._MODULE_OF.get(last)
    if head == "trnlab" and lazy:
        return f"trnlab.{lazy}"
    while name not in modules:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str, modules=None) -> tuple[set[str], list[tuple[str, int]]]:
    """``(modules imported at the top, [(module, line)] imported anywhere else)``.

    "Anywhere else": inside a function, method or class, or at module level after the first
    ``def``/``class``.
    """
    modules = MODULES if modules is None else modules
    path = modules[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    first_def = min((n.lineno for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))), default=1 << 30)
    top, elsewhere = set(), []

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
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                for branch in child.orelse:  # the body is for annotations only, never run
                    visit(ast.Module(body=[branch], type_ignores=[]), inside)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for name in targets(child):
                    if name == "trnlab" or name.startswith("trnlab."):
                        found = _module_of(name, modules)
                        if found == module:
                            continue
                        if inside or child.lineno > first_def:
                            elsewhere.append((found, child.lineno))
                        else:
                            top.add(found)
            visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)))

    visit(tree, False)
    return top, elsewhere


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts) + 1)]


def import_edges(modules=None) -> dict[str, set[str]]:
    """``{module: modules it imports}``: its top-level imports and their parent packages (importing
    trnlab.a.b runs trnlab.a first; a module's own packages excepted, whose __init__ may import it)."""
    modules = MODULES if modules is None else modules
    return {m: {p for t in _imports(m, modules)[0] for p in _with_parents(t)} - set(_with_parents(m))
            for m in modules}


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


def test_every_trnlab_import_is_at_the_top_of_its_module():
    elsewhere = [f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {target}"
                 for m in MODULES for target, line in _imports(m)[1]]
    assert not elsewhere, "move these imports to the top of their module:\n" + "\n".join(elsewhere)


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(import_edges())
    assert cycle == [], "import cycle: " + " -> ".join(cycle)


def _imports_by_string(path: Path) -> list[int]:
    """Lines calling ``import_module``, ``__import__`` or ``runpy`` with anything but a literal third-party name."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__",
                                                                              "run_module")
            and not (node.args and isinstance(node.args[0], ast.Constant) and not node.args[0].value.startswith("trnlab"))]


def test_only_the_name_lookups_import_by_string():
    # rank_cores runs the user's script or module inside each rank: that is its job, not an import of trnlab.
    by_string = {m: lines for m, p in MODULES.items()
                 if m not in NAME_LOOKUPS | {"trnlab.rank_cores"} and (lines := _imports_by_string(p))}
    assert not by_string, f"import these at the top instead of by name: {by_string}"


def test_the_checks_can_fail(tmp_path):
    files = {"a": "from trnlab import b\n",
             "b": "import importlib\nimport trnlab.c\ndef f():\n    import trnlab.a\n    importlib.import_module('trnlab.a')\n",
             "c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trnlab import a\n"
                  "def g():\n    pass\nfrom trnlab import a\n"}
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
    modules = {f"trnlab.{name}": tmp_path / f"{name}.py" for name in files}
    assert _imports("trnlab.b", modules) == ({"trnlab.c"}, [("trnlab.a", 4)])
    assert _imports("trnlab.c", modules) == (set(), [("trnlab.a", 6)])  # annotations only; after the first def
    assert _imports_by_string(tmp_path / "b.py") == [5]
    assert find_cycle(import_edges(modules)) == []          # a -> b -> c, c's import of a is not at the top
    assert find_cycle({**import_edges(modules), "trnlab.c": {"trnlab.a"}}) == [
        "trnlab.a", "trnlab.b", "trnlab.c", "trnlab.a"]     # c importing a at its top would close it
    assert _module_of("trnlab.packed_dataset") == "trnlab.training"

