"""Markdown tables from a $TRITONFORMER_BENCH_ROWS file (JSON lines), e.g. of a run cut short.

python lab/gpu/rows_to_tables.py rows.jsonl > tables.md
"""

import sys

from tritonformer_testkit import bench


def main(argv) -> int:
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print(bench.markdown_tables(bench.load_rows(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
