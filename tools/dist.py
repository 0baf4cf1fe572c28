"""Build every distribution of the workspace (wheel and sdist) into dist/, then check their metadata.

``hatch run dist`` runs this. Each member under packages/ and plugins/ is built by hatchling in
this environment (no isolated build environment: nothing is downloaded), into a fresh ``dist/``
at the workspace root. Then the metadata of every file is checked: with ``twine check --strict``
(the check PyPI's upload applies: required fields, a README that renders), and by
``check_metadata`` below (licence file and expression, URLs, classifiers, and every requirement
on another member within that member's release line).

Usage: python tools/dist.py [--out DIR] [--no-check]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def members() -> list[Path]:
    """Every distribution directory of the workspace (packages first, then plugins), sorted."""
    return sorted(p.parent for p in ROOT.glob("packages/*/pyproject.toml")) + sorted(
        p.parent for p in ROOT.glob("plugins/*/pyproject.toml")
    )


def release_line(version: str) -> str:
    """``>=X.Y,<X.(Y+1)`` for version ``X.Y.Z``."""
    major, minor = (int(v) for v in re.findall(r"\d+", version)[:2])
    return f">={major}.{minor},<{major}.{minor + 1}"


def build(out: Path) -> list[Path]:
    """Build each member's wheel and sdist into ``out`` (emptied first); return the files."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for member in members():
        result = subprocess.run(
            [sys.executable, "-m", "hatchling", "build", "-d", str(out)],
            cwd=member,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise SystemExit(f"building {member.relative_to(ROOT)} failed:\n{result.stdout}{result.stderr}")
    return sorted(out.iterdir())


def _wheel_metadata(path: Path) -> tuple[dict[str, list[str]], list[str]]:
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(wheel.read(meta).decode())
    fields: dict[str, list[str]] = {}
    for key, value in message.items():
        fields.setdefault(key, []).append(value)
    return fields, names


def check_metadata(files: list[Path]) -> list[str]:
    """Problems with the built files' metadata (see the module's description); empty when none."""
    versions = {
        tomllib.loads((m / "pyproject.toml").read_text())["project"]["name"]: tomllib.loads(
            (m / "pyproject.toml").read_text()
        )["project"]["version"]
        for m in members()
    }
    problems = []
    for path in files:
        if path.suffix == ".gz":
            with tarfile.open(path) as sdist:
                if not any(n.endswith("/LICENSE") for n in sdist.getnames()):
                    problems.append(f"{path.name}: no LICENSE in the sdist")
            continue
        fields, names = _wheel_metadata(path)
        name = fields["Name"][0]
        if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
            problems.append(f"{path.name}: no LICENSE in the wheel")
        if fields.get("License-Expression") != ["Apache-2.0"]:
            problems.append(f"{path.name}: License-Expression is {fields.get('License-Expression')}")
        for needed in ("Project-URL", "Classifier", "Summary", "Description-Content-Type"):
            if not fields.get(needed):
                problems.append(f"{path.name}: no {needed}")
        for requirement in fields.get("Requires-Dist", []):
            other = re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0]
            if other in versions:
                spec = requirement[len(other) :].split(";")[0].strip()
                spec = re.sub(r"^\[[^]]*\]", "", spec).replace(" ", "")
                expected = release_line(versions[other])
                if set(spec.split(",")) != set(expected.split(",")):
                    problems.append(f"{name}: requires {requirement!r}; members require each other as {expected}")
    return problems


def twine_check(files: list[Path]) -> list[str]:
    """``twine check --strict`` of ``files``; a problem when twine is missing or finds one."""
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        return [f"twine check --strict failed (pip install twine if it is missing):\n{result.stdout}{result.stderr}"]
    return []


def main() -> int:
    """Build, check, report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist")
    parser.add_argument("--no-check", action="store_true", help="build only")
    args = parser.parse_args()
    files = build(args.out)
    print(f"built {len(files)} files into {args.out}")
    if args.no_check:
        return 0
    problems = check_metadata(files) + twine_check(files)
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if not problems:
        print("metadata: ok (twine check --strict, licence, URLs, classifiers, member version ranges)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
