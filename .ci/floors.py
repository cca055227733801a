"""Print a pip constraints file that pins every requirement of pyproject.toml to its floor.

    python .ci/floors.py [EXTRA ...] > floors.txt
    pip install -c floors.txt -e ".[EXTRA,...]"

Every `NAME>=V` among the dependencies, the build requirements and the named extras
becomes `NAME==V`, so the install gets the lowest versions pyproject.toml allows (what a
user with older packages may have); requirements with no floor are left out. Packages
given with --skip (torch: only one build of it lies on CI's disk) are left out too.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?:[^;]*?)>=\s*([0-9][^,;\s]*)")


def floors(pyproject: Path, extras: list[str], skip: set[str]) -> dict[str, str]:
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    reqs = list(data["build-system"]["requires"]) + list(data["project"]["dependencies"])
    optional = data["project"].get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"error: no extra '{extra}' in {pyproject}; extras: {', '.join(optional)}")
        reqs += optional[extra]
    out = {}
    for req in reqs:
        m = FLOOR.match(req)
        if m and m.group(1).lower() not in skip:
            out[m.group(1).lower()] = m.group(2)
    return out


def main(argv: list[str]) -> None:
    skip = {a.split("=", 1)[1].lower() for a in argv if a.startswith("--skip=")}
    extras = [a for a in argv if not a.startswith("--")]
    root = Path(__file__).resolve().parent.parent
    for name, version in sorted(floors(root / "pyproject.toml", extras, skip).items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main(sys.argv[1:])
