"""Markdown table of headline_ab.py rows: median ms per label and the ratio base / new.

python3 lab/gpu/headline_table.py rows.jsonl BASE NEW
"""

import collections
import json
import statistics
import sys


def main():
    path, base, new = sys.argv[1:4]
    rows = collections.defaultdict(list)
    for line in open(path):
        if line.startswith("{"):
            r = json.loads(line)
            if r["ms"] is not None:
                rows[(r["case"], r["mode"], r["label"])].append(r["ms"])
    cases = sorted(
        {(c, m) for c, m, _ in rows}, key=lambda cm: list(rows).index((*cm, new)) if (*cm, new) in rows else 0
    )
    print(f"| case | mode | {base} ms | {new} ms | {base} / {new} |")
    print("|---|---|---:|---:|---:|")
    for case, mode in cases:
        b = statistics.median(rows.get((case, mode, base), [float("nan")]))
        n = statistics.median(rows.get((case, mode, new), [float("nan")]))
        print(f"| {case} | {mode} | {b:.4f} | {n:.4f} | {b / n:.3f} |")


if __name__ == "__main__":
    main()
