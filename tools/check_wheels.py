"""Check built wheels: one per package, versions from __version__, plain dependency names.

    python tools/check_wheels.py DIST_DIR PACKAGE...

A dependency on a sibling must be a plain name (no `name @ file:///...`): a wheel that bakes
in the path of the checkout it was built from installs nowhere else.
"""

from __future__ import annotations

import email.parser
import pathlib
import sys
import zipfile


def wheel_metadata(wheel: pathlib.Path):
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(archive.read(name).decode())


def main(dist: str, packages: list[str]) -> int:
    wheels = {}
    for wheel in sorted(pathlib.Path(dist).glob("*.whl")):
        metadata = wheel_metadata(wheel)
        wheels[metadata["Name"]] = metadata
    problems = [f"no wheel for {p}" for p in packages if p not in wheels]
    for name, metadata in wheels.items():
        for requirement in metadata.get_all("Requires-Dist") or []:
            if "@" in requirement or "file:" in requirement:
                problems.append(f"{name}: dependency with a location baked in: {requirement!r}")
        print(f"{name} {metadata['Version']}: requires {metadata.get_all('Requires-Dist')}")
    for problem in problems:
        print("ERROR:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
