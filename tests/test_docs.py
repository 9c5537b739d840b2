"""The docs quote what the code says today.

- A fenced block that starts ``$ summa plan ARGS`` is a transcript: the
  command is run, and every line below it must be a line of its output
  (whitespace aside; a line ending in ``...`` is the start of one).
- ``<!-- figures of: summa plan ARGS -->`` before a paragraph (up to the next
  blank line) says its figures are that command's: every number with a unit
  (s, GiB, GB, TFLOP/s, a factor such as 21x) and every pair such as
  16667 x 25000 must be in the output, as the doc rounds it.
- Links into the docs name headings that exist, and the sections code
  comments cite by name (docs/benchmarks.md, "NAME") exist.
- Every benchmark command the docs quote whole (no placeholder such as N)
  is one its script's parser takes, and the development guide's module
  table names every module.

The figures are read from the docs, not written here: a change of the model
only needs the docs updated.
"""

import os
import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QUOTING = ["README.md", "docs/user-guide.md"]
MARKER = re.compile(r"<!--\s*figures of:\s*(summa plan [^>]*?)\s*-->")
PAIR = re.compile(r"(\d[\d,]*)\s*[x×]\s*(\d[\d,]*)(?![\d.])")
SINGLE = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s?(TFLOP/s|GiB|GB|s\b|[x×](?![\d]))")


def _text(name: str) -> str:
    return (ROOT / name).read_text()


@lru_cache(maxsize=None)
def _plan(args: str) -> str:
    """What ``python -m summa ARGS`` prints (ARGS starting with ``plan``)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "summa", *shlex.split(args)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"summa {args}: {done.stderr[-2000:]}"
    return done.stdout


def _squeezed(line: str) -> str:
    return " ".join(line.split())


def _transcripts(text: str) -> list[tuple[str, list[str]]]:
    """Each fenced block starting ``$ summa plan``: (its arguments, its other lines)."""
    found = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        first, *rest = block.splitlines() or [""]
        if first.startswith("$ summa plan "):
            found.append((first[len("$ summa "):], [x for x in rest if x.strip()]))
    return found


def _marked(text: str) -> list[tuple[str, str]]:
    """Each figures-of marker: (its command's arguments, the text it covers)."""
    found = []
    for m in MARKER.finditer(text):
        covered = text[m.end():].split("\n\n", 1)[0]
        found.append((m.group(1)[len("summa "):], covered))
    return found


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _figures(text: str) -> tuple[set, list]:
    """The pairs (as integers) and the numbers with units in `text`."""
    pairs = {(int(_number(a)), int(_number(b))) for a, b in PAIR.findall(text)}
    rest = PAIR.sub(" ", text)
    singles = []
    for value, unit in SINGLE.findall(rest):
        decimals = len(value.split(".")[1]) if "." in value else 0
        singles.append((_number(value), decimals, "x" if unit in "x×" else unit, value + unit))
    return pairs, singles


def _cases():
    cases = []
    for name in QUOTING:
        text = _text(name)
        cases += [pytest.param(name, "transcript", args, lines, id=f"{name}: $ summa {args}")
                  for args, lines in _transcripts(text)]
        cases += [pytest.param(name, "figures", args, covered, id=f"{name}: figures of {args}")
                  for args, covered in _marked(text)]
    return cases


@pytest.mark.parametrize("name", QUOTING)
def test_each_doc_quotes_summa_plan_through_a_checked_command(name):
    text = _text(name)
    assert _transcripts(text) or _marked(text), f"{name} quotes no checked summa plan"
    # a plan quoted without its grid would follow a default that may change
    for args, _ in _transcripts(text) + _marked(text):
        assert "--grid" in args.split(), f"{name}: summa {args} names no --grid"


@pytest.mark.parametrize("name, kind, args, quoted", _cases())
def test_quoted_plan_figures_are_what_summa_plan_prints(name, kind, args, quoted):
    output = _plan(args)
    if kind == "transcript":
        lines = [_squeezed(x) for x in output.splitlines()]
        for line in quoted:
            want = _squeezed(line)
            if want.endswith("..."):
                hit = any(x.startswith(want[:-3].rstrip()) for x in lines)
            else:
                hit = want in lines
            assert hit, f"{name}: `summa {args}` no longer prints:\n  {want}\nbut:\n{output}"
        return
    pairs, singles = _figures(output)
    quoted_pairs, quoted_singles = _figures(quoted)
    assert quoted_pairs or quoted_singles, f"{name}: no figures after the marker for {args}"
    for pair in quoted_pairs:
        assert pair in pairs, f"{name}: {pair[0]} x {pair[1]} is not in `summa {args}`:\n{output}"
    for value, decimals, unit, shown in quoted_singles:
        hit = any(u == unit and round(v, decimals) == value for v, _, u, _ in singles)
        assert hit, f"{name}: {shown!r} is not in `summa {args}` (as rounded):\n{output}"


def test_figures_are_read_as_rounded_numbers_with_units():
    pairs, singles = _figures("about 23 s, 11.0 s, tiles of 16667 × 25000 (3 x 1), 21.1x, "
                              "86.2 TFLOP/s, 74.5 GiB, 160.0 GB, grid 2x4")
    assert pairs == {(16667, 25000), (3, 1), (2, 4)}
    assert [(v, d, u) for v, d, u, _ in singles] == [
        (23, 0, "s"), (11.0, 1, "s"), (21.1, 1, "x"), (86.2, 1, "TFLOP/s"), (74.5, 1, "GiB"),
        (160.0, 1, "GB")]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(name: str) -> list[str]:
    return [h.strip().replace("`", "") for h in
            re.findall(r"^#{1,6} (.+)$", _text(name), re.M)]


DOCS = ["README.md"] + [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md"))] \
    + ["benchmarks/README.md"]


@pytest.mark.parametrize("name", DOCS)
def test_links_into_the_docs_name_headings_that_exist(name):
    here = (ROOT / name).parent
    for target, anchor in re.findall(r"\]\(([^)#\s]*\.md)?#([^)\s]+)\)", _text(name)):
        path = (here / target) if target else ROOT / name
        assert path.exists(), f"{name}: link to {target}, which is not there"
        slugs = {_slug(h) for h in _headings(str(path.resolve().relative_to(ROOT)))}
        assert anchor in slugs, f"{name}: #{anchor} names no heading of {path.name}"


def test_sections_the_code_cites_exist():
    headings = _headings("docs/benchmarks.md")
    cited = {}
    sources = list((ROOT / "summa").rglob("*.py")) + list((ROOT / "benchmarks").glob("*.py"))
    for path in sorted(sources):
        # a comment's lines joined, its markers dropped, so a name may wrap
        text = re.sub(r"\n\s*(?:#:?)?\s*", " ", path.read_text())
        for section in re.findall(r"docs/benchmarks\.md[,;]? \"([^\"]+)\"", text):
            cited.setdefault(section, path.relative_to(ROOT))
    assert cited, "no citation found: the pattern no longer matches the comments"
    for section, where in cited.items():
        assert any(h == section or h.startswith(section + ":") for h in headings), \
            f"{where} cites docs/benchmarks.md, \"{section}\": no such section"


def test_the_code_cites_scripts_the_repo_holds():
    """A comment that cites a script names one a reader can run: in
    benchmarks/, tests/ or the package (not a probe that has left the tree)."""
    held = {p.name for p in ROOT.rglob("*.py") if ".venv" not in p.parts}
    missing = []
    sources = list((ROOT / "summa").rglob("*.py")) + list((ROOT / "benchmarks").glob("*.py"))
    for path in sorted(sources):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for script in re.findall(r"\b(\w+\.py)\b", line):
                if script not in held:
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {script}")
    assert not missing, "\n".join(missing)


#: A benchmark command quoted in inline code (`benchmarks/X.py ...`, with or
#: without its ``python3``) or as a line of a block.
COMMAND = re.compile(r"`(?:python3? )?(benchmarks/\w+\.py(?:\s[^`]*)?)`"
                     r"|^(?:python3? )(benchmarks/\w+\.py[^\n]*)$", re.MULTILINE)
#: Words that stand for what the reader fills in (N, MxNxK, [--free 24GiB], G, ...).
PLACEHOLDER = re.compile(r"^(?:[A-Z]+(?:x[A-Z]+)*|\[.*|.*\]|\.\.\.|\w*\*\w*)$")
_PARSES = """
import argparse, runpy, sys
class Parsed(Exception):
    pass
real = argparse.ArgumentParser.parse_args
def parse_args(self, args=None, namespace=None):
    real(self, args, namespace)
    raise Parsed
argparse.ArgumentParser.parse_args = parse_args
sys.argv = sys.argv[1:]
sys.path.insert(0, "benchmarks")
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except Parsed:
    sys.exit(0)
sys.exit("parsed no arguments")
"""


def _quoted_commands() -> list:
    """Every whole benchmark command the docs quote, with where."""
    found = []
    for name in ["README.md", "docs/user-guide.md", "docs/benchmarks.md",
                 "docs/development.md", "benchmarks/README.md"]:
        for quoted, line in COMMAND.findall(_text(name)):  # (inline; a block's line)
            words = shlex.split(quoted or line)
            if not any(PLACEHOLDER.match(word) for word in words):
                found.append((name, words))
    return found


@pytest.mark.parametrize("name, words", _quoted_commands(),
                         ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_each_benchmark_command_the_docs_quote_is_one_its_script_takes(name, words):
    """A figure's command still runs: its script exists and its parser
    takes the arguments as quoted (a renamed option would leave the docs
    quoting a command that fails)."""
    assert (ROOT / words[0]).exists(), f"{name}: {words[0]} is not in the repo"
    done = subprocess.run([sys.executable, "-c", _PARSES, *words], capture_output=True,
                          text=True, cwd=ROOT, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, f"{name}: `{' '.join(words)}`: {done.stderr[-800:]}"


def test_the_module_table_has_a_row_for_every_module():
    """docs/development.md's module table names every module of the package
    (a row may name several of one folder: `summa/cli/plan.py`, `info.py`)."""
    named = set()
    for line in _text("docs/development.md").splitlines():
        if not line.startswith("| `summa/") and not line.startswith("| **`summa/"):
            continue
        first = line.split("|")[1]
        folder = None
        for name in re.findall(r"`([^`]+)`", first):
            if name.startswith("summa/"):
                folder = os.path.dirname(name)
                named.add(name)
            elif folder is not None:
                named.add(f"{folder}/{name}")
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "summa").rglob("*.py")
               if "__pycache__" not in p.parts and
               (p.name != "__init__.py" or p.parent == ROOT / "summa")}
    assert sorted(modules - named) == []
