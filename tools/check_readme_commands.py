"""The README's commands are the ones CI and the sessions run.

    python tools/check_readme_commands.py "MAIN_COMMAND"

- .ci/run runs exactly the README's test command (the block after "Run the tests");
- the README's main command (the block after "Train a small GPT") installs the model and trains
  as the packaging session does.
"""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def command_after(lines: list[str], marker: str) -> str:
    """The first line of the first ```sh block after the line that contains marker."""
    start = next(i for i, line in enumerate(lines) if marker in line)
    fence = next(i for i in range(start, len(lines)) if lines[i].startswith("```"))
    return lines[fence + 1].strip()


def main(main_command: str) -> int:
    readme = (ROOT / "README.md").read_text().splitlines()
    test_command = command_after(readme, "Run the tests")
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    problems = []
    if test_command not in ci_lines:
        problems.append(f".ci/run does not run the README's test command: {test_command!r}")
    command = command_after(readme, "Train a small GPT")
    if command != main_command:
        problems.append(f"README main command {command!r} != the packaging session's {main_command!r}")
    for problem in problems:
        print("ERROR:", problem)
    if not problems:
        print(f"README test command, also in .ci/run: {test_command}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
