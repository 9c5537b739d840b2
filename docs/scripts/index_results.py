"""Write docs/results/INDEX.md: for every raw record of the GPU runs, the
machine, the session, what it measured (the STAGE of gpu_session.sh that
wrote it) and the section of docs/benchmarks.md that uses it.

    python3 docs/scripts/index_results.py
"""

from __future__ import annotations

import os
import re

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(DOCS, "results")

#: What files of no stage of their own hold, by the word in their names.
WORDS = {"bench": "`bench` runs of the session", "peers": "`compare_peers.py` tables",
         "strong": "strong-scaling runs for the model", "weak": "weak-scaling runs for the model",
         "host": "host-GPU copy rates (`host_copy_probe.py`)", "gpu": "the GPU test suite's output",
         "sweep": "the randomized correctness sweep (`tests/test_sweep.py`)",
         "keepprobe": "blocks kept open: the probe", "one": "one-GPU runs",
         "split": "`split_probe.py`: GEMMs over parts of K", "": "`bench` runs of the session"}


def stages() -> dict:
    """STAGE name -> its description, from gpu_session.sh's header."""
    found = {}
    with open(os.path.join(DOCS, "scripts", "gpu_session.sh")) as fh:
        for line in fh:
            m = re.match(r"#\s+STAGE=(\S+)\s+docs/scripts/gpu_session.sh\s+#\s*(.*)", line)
            if m:
                found[m.group(1)] = m.group(2).strip()
    return found


def session_block(lines: list[str], when: str) -> tuple[int, int]:
    """The line range of the session's ``## `` section of docs/benchmarks.md
    (the whole file where none matches)."""
    marker = {"first": "2026-11-30 — ", "late": "(late)", "night": "(night)",
              "evening": "(evening)", "afternoon": "(afternoon)"}.get(
        when, f"session {when[1:]}" if when.startswith("s") else when)
    starts = [i for i, line in enumerate(lines) if line.startswith("## ")]
    for i, start in enumerate(starts):
        if marker in lines[start]:
            return start, starts[i + 1] if i + 1 < len(starts) else len(lines)
    return 0, len(lines)


def sections(lines: list[str], needles: list[str], block=None) -> list[str]:
    """Headings of docs/benchmarks.md sections (within `block`, a line range)
    whose text holds a needle."""
    found = []
    lo, hi = block or (0, len(lines))
    for i, line in enumerate(lines):
        if not lo <= i < hi or not any(n and n in line for n in needles):
            continue
        for j in range(i, -1, -1):
            if lines[j].startswith("#"):
                heading = lines[j].lstrip("#").strip()
                if heading not in found:
                    found.append(heading)
                break
    return found


def main() -> int:
    with open(os.path.join(DOCS, "benchmarks.md")) as fh:
        bench = fh.read().splitlines()
    known = stages()
    rows = []
    for name in sorted(os.listdir(RESULTS)):
        if name == "INDEX.md":
            continue
        base = re.sub(r"\.(jsonl|txt|log)$", "", name)
        machine, date, tag = re.match(r"(h200(?:x\d)?)-(\d{4}-\d\d-\d\d)-?(.*)", base).groups()
        session = re.match(r"(s\d+|late|night|evening|afternoon)?-?(.*)", tag)
        when, token = session.group(1) or "first", session.group(2)
        key = re.sub(r"-(a|b|c|peers|txt)$", "", token)
        what = known.get(key) or known.get(token) or WORDS.get(key.split("-")[0], "")
        needles = [name, base, f"STAGE={key}", f"`{key}`", f"-{token}." if token else ""]
        block = session_block(bench, when)
        cited = (sections(bench, [name, base], None) or sections(bench, needles, block)
                 or [bench[block[0]].lstrip("#").strip()])
        rows.append(f"| `{name}` | {'2 × H200' if machine == 'h200x2' else '1 × H200'} | "
                    f"{date} {when} | {what} | {'; '.join(cited)} |")
    text = ["# Raw records of the GPU runs", "",
            "One line per file: the machine, the session, what it measured (the `STAGE` of",
            "`docs/scripts/gpu_session.sh` that wrote it, or the script) and the sections of",
            "`docs/benchmarks.md` that use it. Written by `python3 docs/scripts/index_results.py`.",
            "", "| file | machine | session | what | cited in docs/benchmarks.md |",
            "| --- | --- | --- | --- | --- |", *rows]
    with open(os.path.join(RESULTS, "INDEX.md"), "w") as fh:
        fh.write("\n".join(text) + "\n")
    print(f"{len(rows)} files indexed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
