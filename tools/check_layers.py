"""Check the layering contracts of ``pyproject.toml`` (``[tool.importlinter]``,
docs/architecture.md, "Layers") with import-linter.

import-linter reads the ``offcut`` package as one folder tree, but this repository maps
``offcut.daemon``, ``offcut.client`` ... to folders of their own (``[tool.setuptools.package-dir]``),
which an editable install keeps. So this script lays the package out as an installation
would (a temporary copy of the mapped folders' ``.py`` files) and runs ``lint-imports`` on it.

Usage (from the repository root, needs the ``dev`` extra)::

    python tools/check_layers.py     # exit 1 and the broken contracts when the layering is broken
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lay_out(into: Path) -> None:
    """Copy every package of ``[tool.setuptools]`` to ``into`` as installed (``.py`` only)."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = setup["package-dir"]
    for package in setup["packages"]:
        parent = next((p for p in sorted(dirs, key=len, reverse=True)
                       if package == p or package.startswith(p + ".")), None)
        if parent is None:
            raise SystemExit(f"{package}: no package-dir mapping in pyproject.toml")
        src = ROOT / dirs[parent] / Path(*package[len(parent):].lstrip(".").split(".")[:])
        dst = into / Path(*package.split("."))
        dst.mkdir(parents=True, exist_ok=True)
        for f in src.glob("*.py"):
            shutil.copy2(f, dst / f.name)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="offcut-layers-") as tmp:
        lay_out(Path(tmp))
        env = dict(os.environ, PYTHONPATH=tmp)
        exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
        return subprocess.run([exe, "--no-logo", "--no-cache", str(ROOT / "pyproject.toml")],
                              cwd=tmp, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
