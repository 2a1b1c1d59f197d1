"""What a release ships: the typing marker and licence in the wheel, one version, the sdist's
own tests (``.ci/sdist_check.sh``)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import posenc

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# --- typing marker ---------------------------------------------------------------------------


def test_the_package_ships_the_pep561_marker() -> None:
    assert (ROOT / "src" / "posenc" / "py.typed").is_file()
    assert (Path(posenc.__file__).parent / "py.typed").is_file()
    package_data = _pyproject()["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["posenc"]


@pytest.mark.slow
def test_the_wheel_holds_the_typing_marker(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("posenc-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "posenc/py.typed" in names
