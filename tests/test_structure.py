"""The package's interfaces, read from its source: no private name is
imported across modules, the backend's name is compared in backend selection
only (everyone else asks the Backend or :func:`summa.device.traits.traits`), and no
module keeps hidden state behind ``global`` or ``nonlocal``."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "summa"

#: (importing module, home module, name) of private imports still allowed.
PRIVATE_IMPORTS_ALLOWED: set = set()

#: Modules where ``global`` stays: options' one explicit cache of the parsed
#: settings. (What a process has one of, its pool of worker ranks and its
#: running watchdog, sits in an attribute of one module-level object each:
#: summa.pool.launch's ``slot`` and summa.runtime.watchdog's ``_slot``.)
GLOBAL_ALLOWED = {"summa.options"}

#: Backend names are compared in backend selection only: get_backend's choice
#: and summa.device.traits, the one description of a name.
BACKEND_NAMES = {"cupy", "numpy"}
BACKEND_COMPARISONS_MAX = 5
SELECTION_FILES = {"summa.device.backend", "summa.device.traits"}


def _modules(root: pathlib.Path = PACKAGE):
    for path in sorted(root.rglob("*.py")):
        yield dotted(path, root), ast.parse(path.read_text(), str(path))


def dotted(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> str:
    """A module's identity, its dotted name: ``summa.device.backend``,
    ``summa.pool`` for pool/__init__.py."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private_imports(modules) -> list[tuple[str, str, str]]:
    """(module, home, name) of each ``from .home import _name``."""
    found = []
    for name, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module:
                home = imported_from(name, node)
                found += [(name, home, alias.name) for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def imported_from(module: str, node: ast.ImportFrom) -> str:
    """The dotted name relative import `node` in `module` reads from."""
    package = module.split(".")
    if not (PACKAGE.parent.joinpath(*package) / "__init__.py").is_file():
        package = package[:-1]  # a module, not a package's __init__
    return ".".join(package[:len(package) - node.level + 1] + [node.module])


def backend_comparisons(modules) -> list[tuple[str, int]]:
    """(module, line) of each ``==``/``!=`` comparison with ``"cupy"`` or ``"numpy"``."""
    found = []
    for name, tree in modules:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            if not all(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
                continue
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and o.value in BACKEND_NAMES for o in operands):
                found.append((name, node.lineno))
    return found


def scope_statements(modules, kind) -> list[tuple[str, int]]:
    """(module, line) of each statement of `kind` (ast.Global or ast.Nonlocal)."""
    return [(name, node.lineno) for name, tree in modules
            for node in ast.walk(tree) if isinstance(node, kind)]


def test_no_private_names_imported_across_modules():
    found = set(private_imports(_modules())) - PRIVATE_IMPORTS_ALLOWED
    assert not found, f"give these a public name in their home module: {sorted(found)}"


def test_backend_names_compared_in_backend_selection_only():
    found = backend_comparisons(_modules())
    outside = [f for f in found if f[0] not in SELECTION_FILES]
    assert not outside, ("ask the Backend (is_gpu, supports_ipc ...) or "
                         "summa.device.traits.traits(name) "
                         f"instead of comparing its name: {outside}")
    assert len(found) <= BACKEND_COMPARISONS_MAX, found


def test_no_global_outside_the_explicit_caches():
    found = [(m, line) for m, line in scope_statements(_modules(), ast.Global)
             if m not in GLOBAL_ALLOWED]
    assert not found, f"keep this state in an object that travels: {found}"


def test_no_nonlocal():
    assert not scope_statements(_modules(), ast.Nonlocal)


@pytest.mark.parametrize("source,check", [
    ("from .selection import _hidden\n", private_imports),
    ("x = backend.name == 'cupy'\n", backend_comparisons),
    ("def f():\n    global y\n", lambda m: scope_statements(m, ast.Global)),
    ("def f():\n    y = 1\n    def g():\n        nonlocal y\n", lambda m: scope_statements(m, ast.Nonlocal)),
])
def test_each_check_finds_what_it_forbids(tmp_path, source, check):
    (tmp_path / "added.py").write_text(source)
    assert check(_modules(tmp_path))


def session_labels(root: pathlib.Path = PACKAGE) -> list[tuple[str, int]]:
    """(module, line) of each comment or string citing a work session ("s13",
    "s17d", "session 16") instead of a benchmark by name."""
    label = re.compile(r"\bs[1-9][0-9][a-z]?\b|\b[Ss]ession [0-9]+")
    return [(dotted(path, root), number) for path in sorted(root.rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if label.search(line)]


def test_comments_cite_benchmarks_not_sessions(tmp_path):
    assert not session_labels(), "cite the benchmark by name and what it showed"
    (tmp_path / "added.py").write_text("x = 8  # measured no faster, s13\n")
    assert session_labels(tmp_path)


#: The top of the package: the entry modules and the settings; the rest lives
#: in the subpackage of its concern (docs/development.md, "Layout of the code").
TOP_MODULES = {"summa", "summa.__main__", "summa.options"}


def test_the_package_is_laid_out_by_concern():
    names = dict(_modules())
    top = {name for name in names if name.count(".") == 0 or name.count(".") == 1
           and not (PACKAGE / name.split(".")[1] / "__init__.py").is_file()}
    assert top == TOP_MODULES, f"put these in the subpackage of their concern: {top - TOP_MODULES}"
    packages = sorted(path.parent for path in PACKAGE.glob("*/__init__.py"))
    assert packages, "no subpackages"
    for package in packages:
        assert ast.get_docstring(names[dotted(package / "__init__.py")]), (
            f"{package.name}/__init__.py: say in its docstring what the concern is")
    loose = [path for path in PACKAGE.rglob("*.py") if not (path.parent / "__init__.py").is_file()]
    assert not loose, f"folders of modules without __init__.py: {loose}"


# ---------------------------------------------------------------------------
# A module a concern (issue 62): sizes, imports at the top, no circles.

#: Longest a module may be; past it, a module does several jobs.
MAX_MODULE_LINES = 550

#: Modules over MAX_MODULE_LINES, each with why it stays so for now.
LONG_MODULES = {
}


def module_lines(root: pathlib.Path = PACKAGE) -> dict:
    """{module: lines} of every module of the package."""
    return {dotted(path, root): len(path.read_text().splitlines())
            for path in sorted(root.rglob("*.py"))}


def test_no_module_is_longer_than_one_concern_takes():
    lines = module_lines()
    long = {name: n for name, n in lines.items() if n > MAX_MODULE_LINES}
    unlisted = {name: n for name, n in long.items() if name not in LONG_MODULES}
    assert not unlisted, (f"over {MAX_MODULE_LINES} lines: split by concern, or list it in "
                          f"LONG_MODULES with why: {unlisted}")
    stale = set(LONG_MODULES) - set(long)
    assert not stale, f"no longer long: take them out of LONG_MODULES: {sorted(stale)}"


def resolved_imports(module: str, node, root: pathlib.Path = PACKAGE) -> list[str]:
    """The dotted names import statement `node` of `module` reads, as
    ../shared/tools/import_circles.py resolves them (``from . import x``:
    the package and ``package.x``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        package = module.split(".")
        if not (root.parent.joinpath(*package) / "__init__.py").is_file():
            package = package[:-1]
        base = ".".join(package[:len(package) - node.level + 1]
                        + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_edges(modules, inside_functions: bool | None = None) -> set[tuple[str, str]]:
    """(module, imported module) of the package's imports of its own modules;
    `inside_functions` True: only those made inside functions, False: only
    the others, None: all."""
    modules = list(modules)
    known = {name for name, _ in modules}
    top = PACKAGE.name
    edges = set()
    for name, tree in modules:
        inner = {id(node) for fn in ast.walk(tree)
                 if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if inside_functions is not None and (id(node) in inner) != inside_functions:
                continue
            edges |= {(name, target) for target in resolved_imports(name, node)
                      if target in known and target != name and target != top}
    return edges


#: Imports of summa's own modules made inside functions, each with why.
#: The command line's fast start: ``summa --help``, plan, model and options
#: load neither MPI nor CuPy, the rest only once the command is known.
FUNCTION_IMPORTS_ALLOWED = {
    ("summa.__main__", target): "the command line's fast start"
    for target in ("summa.cli", "summa.device.account", "summa.device.traits",
                   "summa.options", "summa.pool", "summa.pool.job", "summa.runtime.agree",
                   "summa.runtime.cleanup", "summa.runtime.mpi", "summa.runtime.watchdog")}


def test_summas_own_modules_are_imported_at_the_top():
    found = import_edges(_modules(), inside_functions=True)
    listed = set(FUNCTION_IMPORTS_ALLOWED)
    new = sorted(found - listed)
    assert not new, ("import these at the top of the module (inside a function only for "
                     "an optional dependency or the command line's fast start, listed in "
                     f"FUNCTION_IMPORTS_ALLOWED with why): {new}")
    gone = sorted(listed - found)
    assert not gone, ("no longer imported inside a function: take them off "
                      f"FUNCTION_IMPORTS_ALLOWED: {gone}")


def circles(edges: set[tuple[str, str]]) -> list[frozenset]:
    """The strongly connected components of more than one node of `edges`."""
    graph: dict = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):  # Tarjan's, as ../shared/tools/import_circles.py
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def subpackage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


#: Circles among subpackages, counting imports made inside functions, that
#: remain to undo (issue 62, item 2: layers one way). A circle within one of
#: these passes; any other fails.
KNOWN_PACKAGE_CIRCLES: list = []


def test_no_import_circles_among_modules_or_new_ones_among_subpackages():
    edges = import_edges(_modules())
    assert not circles(edges), f"modules importing each other: {circles(edges)}"
    between = {(subpackage(a), subpackage(b)) for a, b in edges
               if subpackage(a) != subpackage(b)}
    found = circles(between)
    new = [sorted(c) for c in found if not any(c <= known for known in KNOWN_PACKAGE_CIRCLES)]
    assert not new, f"subpackages importing each other (layers run one way): {new}"
    gone = [sorted(known) for known in KNOWN_PACKAGE_CIRCLES
            if not any(c & known for c in found)]
    assert not gone, f"no longer a circle: take them off KNOWN_PACKAGE_CIRCLES: {gone}"


#: The planner's steps that settle what a plan needs of the machine before a
#: run: broadcasters made and self-tested (whether direct copies work is
#: learned there), the plan made final for them. Entry points take them
#: through summa.planning (issue 62, "plan once, then run"); an executor
#: runs the plan it is handed and decides nothing.
PLANNING_STEPS = {"restage", "grid_broadcasters"}

#: (executor module, step) still taken in an executor, each to move into
#: planning as the out-of-core sweep's set-up did (summa.planning.sweepsetup):
#: the in-memory path makes its broadcasters in gemm's set-up and in prepare.
EXECUTOR_STEPS_ALLOWED = {("summa.execution.algorithm", "grid_broadcasters")}


def planning_calls(modules) -> set[tuple[str, str]]:
    """(module, step) of each call of one of :data:`PLANNING_STEPS`, by its
    name or as an attribute (``planner.restage(...)``)."""
    found = set()
    for name, tree in modules:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if called in PLANNING_STEPS:
                found.add((name, called))
    return found


def test_executors_take_no_planning_steps():
    found = {(module, step) for module, step in planning_calls(_modules())
             if module.startswith("summa.execution.")}
    taken = found - EXECUTOR_STEPS_ALLOWED
    assert not taken, ("an executor decides nothing: take these in summa.planning "
                       f"before the run and hand the executor what they made: {sorted(taken)}")
    stale = EXECUTOR_STEPS_ALLOWED - found
    assert not stale, f"no longer taken there: take them off EXECUTOR_STEPS_ALLOWED: {stale}"


def test_the_planning_step_check_finds_what_it_forbids(tmp_path):
    (tmp_path / "added.py").write_text("x = planner.restage(plan, (True, True))\n"
                                       "y = grid_broadcasters(grid, 'auto', backend)\n")
    assert {step for _, step in planning_calls(_modules(tmp_path))} == PLANNING_STEPS


@pytest.mark.parametrize("files,check", [
    ({"a.py": "def f():\n    from . import b\n", "b.py": ""},
     lambda m: import_edges(m, inside_functions=True)),
    ({"a.py": "from . import b\n", "b.py": "def f():\n    from . import a\n"},
     lambda m: circles(import_edges(m))),
])
def test_the_import_checks_find_what_they_forbid(tmp_path, files, check):
    package = tmp_path / "summa"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, source in files.items():
        (package / name).write_text(source)
    assert check(_modules(package))
