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
def test_the_wheel_holds_the_typing_marker_and_the_licence(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("posenc-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert "posenc/py.typed" in names
        (licence,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert z.read(licence) == (ROOT / "LICENSE").read_bytes()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = z.read(meta).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata
    assert "Classifier: Typing :: Typed" in metadata
    assert "Classifier: License ::" not in metadata


# --- licence and metadata --------------------------------------------------------------------


def test_the_licence_is_the_apache_2_0_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith(
        "Apache License\n                           Version 2.0, January 2004"
    )
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "9. Accepting Warranty or Additional Liability." in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(text.splitlines()) > 170  # the whole text, not a pointer to it


def test_the_project_metadata_names_licence_authors_classifiers_and_keywords() -> None:
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert project["authors"] == [{"name": "posenc developers"}]
    assert project["keywords"]
    classifiers = set(project["classifiers"])
    assert {
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Science/Research",
        "Intended Audience :: Developers",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Typing :: Typed",
        "Operating System :: OS Independent",
    } <= classifiers
    assert not any(c.startswith("License ::") for c in classifiers)  # the SPDX string says it
    assert "urls" not in project
