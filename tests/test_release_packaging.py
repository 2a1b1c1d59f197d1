"""What a release ships: the typing marker and licence in the wheel, one version, the sdist's
own tests (``.ci/sdist_check.sh``)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import posenc
from posenc.lab.grid.grid_file import tomllib  # tomllib, or on Python 3.10 its backport tomli

ROOT = Path(__file__).resolve().parents[1]


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


# --- one version -----------------------------------------------------------------------------


def test_the_version_has_one_source() -> None:
    from importlib.metadata import version

    project = _pyproject()["project"]
    assert "version" not in project and "version" in project["dynamic"]
    dynamic = _pyproject()["tool"]["setuptools"]["dynamic"]
    assert dynamic["version"] == {"attr": "posenc.__version__"}
    assert version("posenc") == posenc.__version__


def test_the_built_metadata_follows_dunder_version(tmp_path: Path) -> None:
    """A copy of the project with another ``__version__`` builds metadata with that version."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    pkg = tmp_path / "src" / "posenc"
    pkg.mkdir(parents=True)
    init = (ROOT / "src" / "posenc" / "__init__.py").read_text()
    assert f'__version__ = "{posenc.__version__}"' in init
    (pkg / "__init__.py").write_text(
        init.replace(f'__version__ = "{posenc.__version__}"', '__version__ = "9.8.7"')
    )
    (tmp_path / "meta").mkdir()
    code = (
        "from setuptools import build_meta; "
        "print(build_meta.prepare_metadata_for_build_wheel('meta'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    dist_info = done.stdout.strip().splitlines()[-1]
    assert dist_info == "posenc-9.8.7.dist-info"
    assert "\nVersion: 9.8.7\n" in (tmp_path / "meta" / dist_info / "METADATA").read_text()


# --- the sdist -------------------------------------------------------------------------------

# What the sdist carries beside the package, so that it runs its own tests and builds its docs.
SDIST_EXTRAS = ("LICENSE", "Makefile", "mkdocs.yml", "README.md", "README.zh-CN.md")
SDIST_TREES = ("tests", "docs", "benchmarks")


@pytest.mark.slow
def test_the_sdist_carries_tests_data_docs_and_benchmarks(tmp_path: Path) -> None:
    """Every file of tests/ (tests/data/** included), docs/ and benchmarks/ in the checkout is in
    the sdist (``.ci/sdist_check.sh`` then collects the sdist's tests)."""
    import tarfile

    code = (
        "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    sdist = tmp_path / done.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as tar:
        top = f"posenc-{posenc.__version__}/"
        names = {m.name.removeprefix(top) for m in tar.getmembers() if m.isfile()}
    for name in SDIST_EXTRAS:
        assert name in names, name
    want = {
        p.relative_to(ROOT).as_posix()
        for tree in SDIST_TREES
        for p in (ROOT / tree).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert any(n.startswith("tests/data/hf_configs/") for n in want)
    assert want <= names, sorted(want - names)[:20]
    assert not any(n.endswith(".pyc") for n in names)


# --- dependencies ----------------------------------------------------------------------------


def _requirement(name: str) -> str:
    (req,) = [r for r in _pyproject()["project"]["dependencies"] if r.startswith(name)]
    return req


def test_the_folder_lock_library_is_a_dependency() -> None:
    assert _requirement("filelock") == "filelock>=3.12"  # posenc.runs.lock, on every OS


def test_the_toml_backport_is_a_dependency_below_python_3_11_only() -> None:
    """``posenc lab --config`` reads TOML with tomllib, new in Python 3.11; requires-python
    admits 3.10, which gets tomli (posenc.lab.grid.grid_file), and no later Python does."""
    assert _pyproject()["project"]["requires-python"] == ">=3.10"
    assert _requirement("tomli") == "tomli>=2; python_version<'3.11'"


def test_the_torch_floor_has_flex_attention_with_gqa() -> None:
    """posenc.attention.paths passes ``enable_gqa`` to FlexAttention, new in torch 2.5."""
    assert _requirement("torch") == "torch>=2.5"
    assert "enable_gqa=" in (ROOT / "src" / "posenc" / "attention" / "paths.py").read_text()


def test_a_downstream_strict_mypy_sees_real_types(tmp_path: Path) -> None:
    """A user's file type-checked with ``mypy --strict`` against the installed posenc: the
    marker makes mypy read posenc's own annotations (no "missing library stubs"), so a call's
    result has its real type and a misuse is an error. torch, transformers, numpy and sympy
    are not followed (their types read as Any): posenc's own annotations are the subject, and
    analysing torch from scratch took 30-60 s of the suite's time."""
    pytest.importorskip("mypy")
    (tmp_path / "mypy.ini").write_text(
        "[mypy]\n[mypy-torch.*,transformers.*,numpy.*,sympy.*]\nfollow_imports = skip\n"
    )
    user = tmp_path / "use_posenc.py"
    user.write_text(
        "from posenc.hf import rope_from_hf\n"
        "rope = rope_from_hf({'model_type': 'llama', 'hidden_size': 64,\n"
        "                     'num_attention_heads': 4, 'rope_theta': 10000.0})\n"
        "reveal_type(rope)\n"
        "n: int = rope_from_hf  # a function is no int\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(user)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    out = res.stdout
    assert "missing library stubs" not in out and "import-untyped" not in out, out
    assert 'Revealed type is "posenc.rotary.embedding.RotaryEmbedding"' in out, out
    assert "use_posenc.py:5: error: Incompatible types in assignment" in out, out
    assert "Found 1 error in 1 file" in out, out
