"""The README's commands are the ones CI and the sessions run.

    python tools/check_readme_commands.py FULL_MODEL_INSTALL...

- .ci/run runs exactly the README's test command (the line after "Run the tests:");
- the README's full-model install is the command the packaging session proves.
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


def main(full_model_install: list[str]) -> int:
    readme = (ROOT / "README.md").read_text().splitlines()
    test_command = command_after(readme, "Run the tests")
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    problems = []
    if test_command not in ci_lines:
        problems.append(f".ci/run does not run the README's test command: {test_command!r}")
    install = command_after(readme, "Install the full model")
    if install != " ".join(full_model_install):
        problems.append(f"README full-model install {install!r} != the packaging session's {full_model_install!r}")
    for problem in problems:
        print("ERROR:", problem)
    if not problems:
        print(f"README test command, also in .ci/run: {test_command}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
