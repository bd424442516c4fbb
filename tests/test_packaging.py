"""The package as an operator installs it: a non-editable wheel built from
this tree, installed into a fresh venv outside the checkout, runs a kernel.

Editable installs (what scripts/setup does) hide a wheel that misses files:
a fixed package list once shipped without ``kem_port.arweave`` and the port
died at start. The fresh venv sees the test venv's dependencies (wgpu,
erlang-py, ...) through a path line, not its ``.pth`` files, so the editable
``kem_port`` of the checkout is out of its reach.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest

from kem_port.wire import terms
from kem_port.client import PortClient

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: the test venv's setuptools builds it, offline.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        cwd=out,
    )
    (found,) = out.glob("kem_port-*.whl")
    return found


@pytest.fixture(scope="module")
def installed_python(wheel: Path, tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
        cwd=venv,
    )
    # Dependencies from the test venv, appended after the wheel's own files.
    (site / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_wheel_holds_every_subpackage_kernels_pages_and_license(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "kem_port").rglob("*.py")}
    kernels = {p.relative_to(ROOT).as_posix() for p in (ROOT / "kem_port" / "kernels").glob("*.wgsl")}
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "kem_port" / "playground" / "static").iterdir()}  # kem playground's page
    assert sources and kernels and pages
    assert sources - names == set()
    assert kernels - names == set()
    assert pages - names == set()
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "License: Apache-2.0" in text
    # Runtime dependencies are exactly what the package imports at module
    # level (lazy imports, like Pillow's, are extras).
    runtime = {
        normalize(re.split(r"[<>=!~ ;\[]", line.removeprefix("Requires-Dist:").strip())[0])
        for line in text.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    }
    assert runtime == module_level_imports()


def module_level_imports() -> set[str]:
    """Distributions of the third-party modules kem_port imports at module level."""
    dists = importlib.metadata.packages_distributions()
    found: set[str] = set()
    for path in (ROOT / "kem_port").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("kem_port", "__future__"):
                    continue
                found.update(normalize(d) for d in dists[top])
    return found


def normalize(dist: str) -> str:
    """PEP 503 names: erlang_py and erlang-py are one distribution."""
    return re.sub(r"[-_.]+", "-", dist).lower()


def test_installed_wheel_is_the_one_imported(installed_python: Path, tmp_path: Path) -> None:
    where = subprocess.run(
        [str(installed_python), "-c", "import kem_port, kem_port.arweave; print(kem_port.__file__)"],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    ).stdout.strip()
    assert Path(where).is_relative_to(installed_python.parents[1])
    assert not Path(where).is_relative_to(ROOT)


@pytest.mark.parametrize("words", [1, 37, 4096])
def test_installed_wheel_runs_a_kernel(installed_python: Path, words: int, rng, tmp_path, monkeypatch) -> None:
    data = rng.integers(0, 2**32, size=words, dtype="<u4")
    # `python -m' puts the working directory first on sys.path: leave the checkout.
    monkeypatch.chdir(tmp_path)
    with PortClient(python=str(installed_python)) as port:
        assert port.call("ping") == terms.atom("pong")
        out = np.frombuffer(port.call("execute_kernel", b"double", data.tobytes(), 1), dtype="<u4")
    np.testing.assert_array_equal(out, data * np.uint32(2))
