"""The Python packages a GPU machine without a package registry lacks, carried as wheels.

    python -m gpucheck.wheels download   # here, with PyPI: into .gpu-wheels/ (git-ignored)
    python -m gpucheck.wheels install    # there, offline: into .gpu-site/, then checked

`download` resolves gpuwarden's requirements (and the GPU check's own: pytest, nvitop,
gpustat) for the target's Python (3.12, manylinux x86_64 by default) and keeps the wheels of the
packages the target does not already hold — the names in `--have` (a `pip freeze` or
`pip list --format=freeze` of the target; default: the CUDA image the check was written for,
`gpu-image-packages.txt`). torch and accelerate (which needs torch) are never carried: the target's
own CUDA build must be used. `install` puts the carried wheels into `.gpu-site/` without touching
the machine's Python, and says in one line per package what is still missing or too old.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".gpu-wheels"
SITE = REPO / ".gpu-site"
IMAGE_PACKAGES = Path(__file__).with_name("gpu-image-packages.txt")
# What the check itself needs beyond gpuwarden; nvitop and gpustat are the peers it measures.
CHECK_REQUIREMENTS = ("pytest>=8", "pytest-timeout>=2.3", "nvitop", "gpustat")
# The target's own builds: a carried torch would replace its CUDA build with whatever PyPI has.
NEVER_CARRIED = frozenset({"torch", "accelerate", "triton"})
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)
# Published as source only: built into a (pure Python) wheel here; their own needs are downloaded.
BUILT_HERE = frozenset({"gpustat"})
CARRY_LIMIT = 60 * 2**20


def normalise(name: str) -> str:
    """PEP 503 name: lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalise(re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0])


def requirements() -> list[str]:
    """gpuwarden's runtime requirements (pyproject.toml) plus the check's own."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *CHECK_REQUIREMENTS]


def have_names(path: Path) -> set[str]:
    """Package names from a `pip freeze` / `pip list --format=freeze` file, or one name a line."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(requirement_name(line))
    return names


def wheel_name(path: Path) -> str:
    return normalise(path.name.split("-", 1)[0])


def _wheel_requirements(wheel: Path) -> list[str]:
    """A wheel's unconditional Requires-Dist lines."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    return [
        line.split(":", 1)[1].strip()
        for line in lines
        if line.startswith("Requires-Dist:") and "extra" not in line
    ]


def download(dest: Path, have: set[str], python_version: str) -> list[Path]:
    """Resolve every requirement for the target, keep the wheels of what it lacks in `dest`."""
    wanted = [r for r in requirements() if requirement_name(r) not in NEVER_CARRIED | BUILT_HERE]
    with tempfile.TemporaryDirectory(prefix="gpu-wheels-") as tmp:
        built = [r for r in requirements() if requirement_name(r) in BUILT_HERE]
        if built:
            pip = [sys.executable, "-m", "pip"]
            subprocess.run([*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", tmp, *built], check=True)
            for wheel in Path(tmp).glob("*.whl"):
                wanted += _wheel_requirements(wheel)
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", tmp, "--only-binary=:all:"]
        argv += ["--python-version", python_version, "--implementation", "cp"]
        for platform in PLATFORMS:
            argv += ["--platform", platform]
        subprocess.run([*argv, *wanted], check=True)
        dest.mkdir(parents=True, exist_ok=True)
        for old in dest.glob("*.whl"):
            old.unlink()
        kept = []
        for wheel in sorted(Path(tmp).glob("*.whl")):
            if wheel_name(wheel) in have or wheel_name(wheel) in NEVER_CARRIED:
                continue
            kept.append(Path(shutil.copy2(wheel, dest / wheel.name)))
    return kept


def missing(site: Path | None, wanted: list[str] | None = None) -> list[str]:
    """Requirements (default: gpuwarden's and the check's, less the optional peers) not satisfied
    by this Python with `site` first on its path: one line each."""
    code = (
        "import sys\n"
        "from importlib import metadata\n"
        "from packaging.requirements import Requirement\n"
        "for line in sys.stdin.read().splitlines():\n"
        "    r = Requirement(line)\n"
        "    if r.marker is not None and not r.marker.evaluate():\n"
        "        continue\n"
        "    try:\n"
        "        v = metadata.version(r.name)\n"
        "    except metadata.PackageNotFoundError:\n"
        "        print(f'{r.name}: not installed (needed: {r})')\n"
        "        continue\n"
        "    if r.specifier and not r.specifier.contains(v, prereleases=True):\n"
        "        print(f'{r.name}: {v} is installed, gpuwarden needs {r}')\n"
    )
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    if wanted is None:
        wanted = [r for r in requirements() if requirement_name(r) not in ("nvitop", "gpustat")]
    done = subprocess.run(
        [sys.executable, "-c", code],
        input="\n".join(wanted),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        return [f"cannot check the requirements: {done.stderr.strip().splitlines()[-1:]}"]
    return done.stdout.strip().splitlines()


def install(wheels: Path, site: Path) -> list[str]:
    """Install every carried wheel into `site` (offline, no resolution: the download resolved),
    then return what is still missing."""
    found = sorted(wheels.glob("*.whl"))
    if found:
        shutil.rmtree(site, ignore_errors=True)
        # Compiled as pip compiles them on any install: the dashboard's and the daemon's start-up
        # are measured as a user would see them, not recompiling every module on every start.
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
        subprocess.run([*pip, "--target", str(site), *map(str, found)], check=True)
    return missing(site if site.exists() else None)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpucheck.wheels", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    down = sub.add_parser("download", help="resolve and download the wheels the target lacks")
    down.add_argument("--dest", type=Path, default=WHEELS)
    down.add_argument("--have", type=Path, default=IMAGE_PACKAGES, help="the target's pip freeze")
    down.add_argument("--python-version", default="3.12")
    inst = sub.add_parser("install", help="install the carried wheels offline into .gpu-site/")
    inst.add_argument("--wheels", type=Path, default=WHEELS)
    inst.add_argument("--site", type=Path, default=SITE)
    args = parser.parse_args(argv)
    if args.command == "download":
        kept = download(args.dest, have_names(args.have), args.python_version)
        size = sum(p.stat().st_size for p in kept)
        names = ", ".join(wheel_name(p) for p in kept)
        print(f"{len(kept)} wheels, {size / 2**20:.1f} MiB in {args.dest}: {names}")
        if size > CARRY_LIMIT:
            print(f"note: more than {CARRY_LIMIT // 2**20} MiB to carry — check --have", file=sys.stderr)
        return 0
    problems = install(args.wheels, args.site)
    for line in problems:
        print(
            f"gpucheck.wheels: {line} — carry its wheel: python -m gpucheck.wheels download", file=sys.stderr
        )
    if not problems:
        print(f"every requirement is met (carried wheels in {args.site})")
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
