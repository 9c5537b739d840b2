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
