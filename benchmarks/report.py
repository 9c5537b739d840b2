"""Markdown tables of benchmark records, so docs/benchmarks.md is made from
what the scripts wrote, not retyped.

Each argument is a JSON-lines file a benchmark script wrote with ``--json``
(one record a line); each becomes a section: the file's name, the machine,
date and command its records carry (:func:`calls.append_json` stamps them;
otherwise the file's date and "not recorded"), and a table of the records'
figures: the fields every record has that are plain values, the ones
that name a case first, times and rates in three significant digits.

    python3 benchmarks/report.py out/*.jsonl > tables.md
    python3 benchmarks/report.py --columns name,first_seconds,again_seconds,status m.jsonl
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

#: Fields that say which case a record is, shown first where present.
FIRST = ("name", "dtype", "layout", "budget", "m", "n", "k", "size", "grid", "ranks",
         "precision")
#: Stamps of the whole file, said above its table rather than in it.
STAMPS = ("machine", "date", "command")


def load(path: str) -> list[dict]:
    """The records of the JSON-lines file `path` (blank lines skipped)."""
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def columns(records: list[dict]) -> list[str]:
    """The fields every record has whose values are plain (not lists or
    records), :data:`FIRST` first, the rest as the first record orders them."""
    plain = [key for key, value in records[0].items() if key not in STAMPS
             and not isinstance(value, (dict, list))
             and all(key in r and not isinstance(r[key], (dict, list)) for r in records)]
    return [key for key in FIRST if key in plain] + [key for key in plain if key not in FIRST]


def cell(value) -> str:
    """`value` as a table shows it: floats in three significant digits."""
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: ""}[value]
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value).replace("|", "\\|")


def stamp(records: list[dict], key: str) -> str | None:
    """What the records say of `key` (one value, or several joined)."""
    said = sorted({str(r[key]) for r in records if r.get(key)})
    return "; ".join(said) or None


def section(path: str, records: list[dict], chosen: list[str] | None = None) -> str:
    """The markdown of one file's records: a heading, its stamps, its table."""
    date = stamp(records, "date") or datetime.date.fromtimestamp(
        os.path.getmtime(path)).isoformat()
    lines = [f"### {os.path.basename(path)}", "",
             f"Machine: {stamp(records, 'machine') or 'not recorded'}. Date: {date}."]
    command = stamp(records, "command")
    if command:
        lines.append(f"Command: `{command}`.")
    if not records:
        return "\n".join(lines + ["", "(no records)", ""])
    keys = chosen or columns(records)
    lines += ["", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(cell(r.get(key)) for key in keys) + " |" for r in records]
    return "\n".join(lines + [""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="JSON-lines files the benchmarks wrote (--json)")
    p.add_argument("--columns", help="comma-separated fields to show (default: see above)")
    args = p.parse_args(argv)
    chosen = args.columns.split(",") if args.columns else None
    for path in args.files:
        try:
            records = load(path)
        except (OSError, ValueError) as exc:
            print(f"report: {path}: {exc}", file=sys.stderr)
            return 2
        print(section(path, records, chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
