"""Check built wheels: one per package, plain dependency names, the LICENSE, the shared runtime.

    python tools/check_wheels.py DIST_DIR PACKAGE...

A dependency on a sibling must be a plain name (no `name @ file:///...`): a wheel that bakes
in the path of the checkout it was built from installs nowhere else. Every wheel carries the
project's LICENSE; every kernel wheel carries runtime/kernel_runtime as `<package>/_runtime`,
file for file identical to the repository's one copy.
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


ROOT = pathlib.Path(__file__).resolve().parent.parent
RUNTIME = ROOT / "runtime" / "kernel_runtime"


def bundle_problems(wheel: pathlib.Path, name: str) -> list[str]:
    """The LICENSE and (kernel packages) the runtime copy inside `wheel`."""
    problems = []
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        licenses = [n for n in names if ".dist-info/" in n and n.rsplit("/", 1)[-1] == "LICENSE"]
        if not licenses or archive.read(licenses[0]) != (ROOT / "LICENSE").read_bytes():
            problems.append(f"{name}: no LICENSE identical to the project's in the wheel")
        if name.startswith("fused-"):
            prefix = name.replace("-", "_") + "/_runtime/"
            for source in sorted(RUNTIME.glob("*.py")):
                member = prefix + source.name
                if member not in names or archive.read(member) != source.read_bytes():
                    problems.append(f"{name}: {member} missing or different from runtime/kernel_runtime/{source.name}")
    return problems


def main(dist: str, packages: list[str]) -> int:
    wheels = {}
    problems = []
    for wheel in sorted(pathlib.Path(dist).glob("*.whl")):
        metadata = wheel_metadata(wheel)
        wheels[metadata["Name"]] = metadata
        problems += bundle_problems(wheel, metadata["Name"])
    problems += [f"no wheel for {p}" for p in packages if p not in wheels]
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
