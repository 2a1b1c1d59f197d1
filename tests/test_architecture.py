"""The package's large-scale shape, read from the source: no import cycle among posenc's modules
(function-level imports included), no file in ``src/`` over 600 lines (500 in ``posenc.lab`` and
``posenc.runs``), no function over 60 lines in ``src/`` and ``benchmarks/``, and the run machinery
(``posenc.runs``) below the lab and ``posenc extend``: it imports neither; ``posenc extend``
beside the lab, not on it (no import of ``posenc.lab``), its stages in folders of at most 12
modules, each stage importing only the stages before it.

Everything here is read with :mod:`ast` from the files as they stand; nothing is imported, so a
cycle is found even where Python's lazy imports would hide it at run time.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "posenc"
BENCHMARKS = ROOT / "benchmarks"

MAX_FILE_LINES = 600
#: The experiment and its run machinery, split by stage into files a reader takes in at once.
MAX_STAGE_FILE_LINES = 500
STAGE_PACKAGES = ("lab", "runs", "extend")
#: Modules side by side in one folder of a stage package, at most (a reader takes a folder in).
MAX_FOLDER_MODULES = 12
#: What ``posenc.runs`` sits below: the commands that use it.
ABOVE_RUNS = ("posenc.lab", "posenc.extend")
MAX_FUNCTION_LINES = 60
SKIP_DIRS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}


def _files(folder: Path, pattern: str = "*") -> list[Path]:
    return sorted(
        p
        for p in folder.rglob(pattern)
        if p.is_file()
        and not SKIP_DIRS.intersection(parts := p.relative_to(folder).parts)
        # setuptools' metadata of an editable install (src/posenc.egg-info: PKG-INFO holds
        # the whole README), not source
        and not any(part.endswith(".egg-info") for part in parts)
    )


def _module_name(path: Path) -> str:
    """``src/posenc/a/b.py`` -> ``posenc.a.b``; ``src/posenc/a/__init__.py`` -> ``posenc.a``."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _files(PACKAGE, "*.py")}


# ---------------------------------------------------------------------------------------------
# Import graph


@dataclass(frozen=True)
class Import:
    """One import statement of ``source`` that reaches the posenc module ``target``."""

    source: str
    target: str
    line: int


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from X import ...`` statement reads ``X`` from."""
    if node.level == 0:
        return node.module or ""
    # The package the relative import is anchored at: the module itself for an __init__.py.
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def _constant_import_module(node: ast.Call) -> str | None:
    """The module named by ``importlib.import_module("posenc.x")`` (a constant string), if any."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name != "import_module" or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def _imports_of(module: str, path: Path, modules: dict[str, Path]) -> Iterator[Import]:
    """Every import of a posenc module in ``path``, wherever it stands (module level, inside a
    function, under ``if TYPE_CHECKING:``): each one is a dependency of the module's code."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(module, is_package, node)
            for alias in node.names:
                # `from pkg import name` reads the submodule pkg.name when there is one.
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in modules else base)
        elif isinstance(node, ast.Call) and (named := _constant_import_module(node)):
            targets = [named]
        for target in targets:
            if target in modules and target != module:
                yield Import(module, target, node.lineno)


def import_graph() -> dict[str, dict[str, int]]:
    """``graph[a][b]``: the first line of module ``a`` that imports module ``b``."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, path in modules.items():
        for imp in _imports_of(name, path, modules):
            graph[name].setdefault(imp.target, imp.line)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the components with more than one module, each sorted."""
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
                    work.append((child, iter(sorted(graph[child]))))
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
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _one_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """A shortest closed path through the component's first module (breadth-first search)."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child not in members:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {component}")


def describe_cycles(graph: dict[str, dict[str, int]]) -> list[str]:
    """One line a strongly connected component: its modules, and one cycle through it with the
    line of each import (``a:12 -> b`` means line 12 of ``a`` imports ``b``)."""
    lines = []
    for component in strongly_connected(graph):
        cycle = _one_cycle(graph, component)
        steps = " -> ".join(f"{a}:{graph[a][b]}" for a, b in pairwise(cycle))
        lines.append(f"{len(component)} modules {component}; e.g. {steps} -> {cycle[-1]}")
    return lines


# ---------------------------------------------------------------------------------------------
# Sizes


def long_files(folder: Path = SRC, limit: int = MAX_FILE_LINES) -> list[str]:
    """Each text file under ``folder`` longer than ``limit`` lines."""
    found = []
    for path in _files(folder):
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        n = len(text.splitlines())
        if n > limit:
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            found.append(f"{shown}: {n} lines")
    return found


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _is_triton_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(_dotted(d).split(".")[0] == "triton" for d in node.decorator_list)


def function_length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` to the last line of the body; a Triton kernel (``@triton.*``) counts
    from its first body statement, its long parameter list aside."""
    first = node.body[0].lineno if _is_triton_kernel(node) else node.lineno
    assert node.end_lineno is not None
    return node.end_lineno - first + 1


def long_functions() -> list[str]:
    """Each function or method (nested ones included) in ``src/`` and ``benchmarks/`` longer than
    :data:`MAX_FUNCTION_LINES` lines, as ``path:line name (n lines)``."""
    found = []
    for folder in (SRC, BENCHMARKS):
        for path in _files(folder, "*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = function_length(node)
                    if n > MAX_FUNCTION_LINES:
                        where = f"{path.relative_to(ROOT)}:{node.lineno}"
                        found.append(f"{where} {node.name} ({n} lines)")
    return found


# ---------------------------------------------------------------------------------------------
# The checks


def test_no_import_cycle() -> None:
    cycles = describe_cycles(import_graph())
    if cycles:
        pytest.fail("import cycles among posenc's modules:\n" + "\n".join(cycles), pytrace=False)


def test_no_file_over_600_lines() -> None:
    found = long_files()
    if found:
        pytest.fail(
            f"files in src/ over {MAX_FILE_LINES} lines:\n" + "\n".join(found), pytrace=False
        )


def test_no_file_over_500_lines_in_the_lab_and_the_run_machinery() -> None:
    found = [f for name in STAGE_PACKAGES for f in long_files(PACKAGE / name, MAX_STAGE_FILE_LINES)]
    if found:
        message = f"files in posenc.lab / posenc.runs over {MAX_STAGE_FILE_LINES} lines:\n"
        pytest.fail(message + "\n".join(found), pytrace=False)


def imports_reaching(
    graph: dict[str, dict[str, int]], source: str, banned: tuple[str, ...]
) -> list[str]:
    """Each import of a module under ``source`` (the package and its modules) of one under a
    ``banned`` package, as ``module:line -> target``."""

    def under(name: str, package: str) -> bool:
        return name == package or name.startswith(package + ".")

    return [
        f"{module}:{line} -> {target}"
        for module, targets in sorted(graph.items())
        if under(module, source)
        for target, line in sorted(targets.items())
        if any(under(target, b) for b in banned)
    ]


def test_the_run_machinery_imports_neither_the_lab_nor_extend() -> None:
    found = imports_reaching(import_graph(), "posenc.runs", ABOVE_RUNS)
    if found:
        message = "posenc.runs imports what sits above it:\n" + "\n".join(found)
        pytest.fail(message, pytrace=False)


def test_extend_does_not_import_the_lab() -> None:
    found = imports_reaching(import_graph(), "posenc.extend", ("posenc.lab",))
    if found:
        pytest.fail("posenc.extend imports the lab:\n" + "\n".join(found), pytrace=False)


#: The stages of ``posenc.extend`` in the order a study walks them; each may import only those
#: before it (the study prints the reports' tables once a study is finished: the one exception).
EXTEND_STAGES = ("model", "methods", "measures", "study", "reports")
EXTEND_EXCEPTIONS = {("posenc.extend.study.command", "posenc.extend.reports.commands")}


def stage_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import from one stage of ``posenc.extend`` to a later one, as ``module:line -> target``."""

    def stage(name: str) -> int | None:
        parts = name.split(".")
        if len(parts) > 2 and parts[:2] == ["posenc", "extend"] and parts[2] in EXTEND_STAGES:
            return EXTEND_STAGES.index(parts[2])
        return None

    return [
        f"{module}:{line} -> {target}"
        for module, targets in sorted(graph.items())
        for target, line in sorted(targets.items())
        if (a := stage(module)) is not None
        and (b := stage(target)) is not None
        and b > a
        and (module, target) not in EXTEND_EXCEPTIONS
    ]


def test_extend_stages_import_only_earlier_stages() -> None:
    found = stage_violations(import_graph())
    if found:
        pytest.fail("a stage of posenc.extend imports a later one:\n" + "\n".join(found),
                    pytrace=False)  # fmt: skip


def crowded_folders(folder: Path, limit: int = MAX_FOLDER_MODULES) -> list[str]:
    """Each folder under ``folder`` with more than ``limit`` modules side by side (``__init__``
    aside)."""
    found = []
    for sub in sorted({p.parent for p in _files(folder, "*.py")}):
        n = len([p for p in sub.glob("*.py") if p.name != "__init__.py"])
        if n > limit:
            found.append(f"{sub.relative_to(ROOT) if sub.is_relative_to(ROOT) else sub}: {n}")
    return found


def test_no_crowded_folder_in_extend() -> None:
    found = crowded_folders(PACKAGE / "extend")
    if found:
        pytest.fail(f"folders of posenc.extend with over {MAX_FOLDER_MODULES} modules:\n"
                    + "\n".join(found), pytrace=False)  # fmt: skip


def test_no_function_over_60_lines() -> None:
    found = long_functions()
    if found:
        message = f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(found)
        pytest.fail(message, pytrace=False)


# ---------------------------------------------------------------------------------------------
# The checkers themselves, on small made-up packages (each must be able to fail)


def _write_package(tmp: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    modules = {}
    for p in tmp.rglob("*.py"):
        parts = list(p.relative_to(tmp).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = p
    return modules


def _graph_of(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, path in modules.items():
        for imp in _imports_of(name, path, modules):
            graph[name].setdefault(imp.target, imp.line)
    return graph


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        # A function-level import closes the circle as surely as a top-level one.
        (
            {
                "posenc/__init__.py": "",
                "posenc/a.py": "from posenc.b import f\n",
                "posenc/b.py": "def f():\n    from posenc import a\n",
            },
            [["posenc.a", "posenc.b"]],
        ),
        # Relative imports, `from . import submodule`, and two levels up.
        (
            {
                "posenc/__init__.py": "",
                "posenc/p/__init__.py": "from . import x\n",
                "posenc/p/x.py": "from ..q.y import g\n",
                "posenc/q/__init__.py": "",
                "posenc/q/y.py": "import posenc.p\n",
            },
            [["posenc.p", "posenc.p.x", "posenc.q.y"]],
        ),
        # importlib with a constant name counts; imports of names (not modules) go to the package.
        (
            {
                "posenc/__init__.py": "from posenc.c import K\n",
                "posenc/c.py": "import importlib\nM = importlib.import_module('posenc')\n",
            },
            [["posenc", "posenc.c"]],
        ),
        # No circle: a chain, and a module importing its own names.
        (
            {
                "posenc/__init__.py": "from posenc.a import f\n",
                "posenc/a.py": "from posenc.b import g\n",
                "posenc/b.py": "import os\nfrom posenc.b import g\n",
            },
            [],
        ),
    ],
)
def test_cycle_finder(tmp_path: Path, files: dict[str, str], expected: list[list[str]]) -> None:
    modules = _write_package(tmp_path, files)
    graph = _graph_of(modules)
    assert strongly_connected(graph) == expected
    for line, component in zip(describe_cycles(graph), expected, strict=True):
        assert all(m in line for m in component)


def test_function_length_counts_nested_and_spares_triton_parameters() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    src = (
        f"def outer():\n    def inner():\n{body.replace('    ', '        ')}\n    return inner\n"
        "@triton.jit\ndef kernel(\n" + "".join(f"    p{i},\n" for i in range(30)) + "):\n"
        f"{body}\n"
    )
    nodes = {n.name: n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)}
    assert function_length(nodes["inner"]) == 60
    assert function_length(nodes["outer"]) == 62
    assert function_length(nodes["kernel"]) == 59


def test_the_layer_check_finds_a_function_level_import(tmp_path: Path) -> None:
    modules = _write_package(tmp_path, {
        "posenc/__init__.py": "",
        "posenc/runs/__init__.py": "",
        "posenc/runs/store.py": "def f():\n    from ..lab.report import g\n",
        "posenc/lab/__init__.py": "",
        "posenc/lab/report.py": "from posenc.runs.store import f\n",
        "posenc/extend/__init__.py": "",
    })  # fmt: skip
    found = imports_reaching(_graph_of(modules), "posenc.runs", ABOVE_RUNS)
    assert found == ["posenc.runs.store:2 -> posenc.lab.report"]


def test_long_files_counts_lines_under_a_folder(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n" * 501)
    (tmp_path / "b.py").write_text("x = 1\n" * 500)
    found = long_files(tmp_path, 500)
    assert len(found) == 1 and found[0].endswith("a.py: 501 lines")


def test_crowded_folders_counts_modules_side_by_side(tmp_path: Path) -> None:
    for i in range(13):
        (tmp_path / "a" / f"m{i}.py").parent.mkdir(exist_ok=True)
        (tmp_path / "a" / f"m{i}.py").write_text("")
    (tmp_path / "a" / "__init__.py").write_text("")
    (tmp_path / "b").mkdir()
    for i in range(12):
        (tmp_path / "b" / f"m{i}.py").write_text("")
    assert [f.rsplit("/", 1)[-1] for f in crowded_folders(tmp_path)] == ["a: 13"]


def test_stage_violations_finds_an_import_of_a_later_stage(tmp_path: Path) -> None:
    modules = _write_package(tmp_path, {
        "posenc/__init__.py": "",
        "posenc/extend/__init__.py": "",
        "posenc/extend/model/__init__.py": "",
        "posenc/extend/model/load.py": "def f():\n    from ..study.run import g\n",
        "posenc/extend/study/__init__.py": "",
        "posenc/extend/study/run.py": "from ..model.load import f\ndef g(): ...\n",
    })  # fmt: skip
    assert stage_violations(_graph_of(modules)) == [
        "posenc.extend.model.load:2 -> posenc.extend.study.run"
    ]
