"""kem_port.api's run_named (issue 25): numpy arrays in by WGSL name, numpy
arrays out with the shapes and dtypes asked for; in/out buffers keep their
own; the port's own refusals as KemError. Real wgpu, values against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from kem_port.api import Runner
from kem_port.api.named import run_named
from kem_port.errors import KemError
from test_named_buffers import KERNELS


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    folder = tmp_path_factory.mktemp("api_named")
    for name in ("add", "axpy", "matmul", "sumdiff"):
        (folder / f"{name}.wgsl").write_text(KERNELS[name])
    return folder


@pytest.fixture(scope="module")
def runner():
    found = Runner()
    yield found
    found.close()


@pytest.mark.parametrize("rows, cols", [(1, 1), (10, 100), (33, 7)])
def test_outputs_come_back_shaped(kernels, runner, rng, rows, cols):
    a, b = rng.standard_normal((rows, cols)).astype(np.float32), rng.standard_normal((rows, cols)).astype(np.float32)
    out = run_named(kernels / "add.wgsl", {"a": a, "b": b}, {"c": ((rows, cols), np.float32)},
                    workgroups=(-(-rows * cols // 64), 1, 1), runner=runner)
    assert out["c"].shape == (rows, cols) and out["c"].dtype == np.float32
    np.testing.assert_array_equal(out["c"], a + b)


def test_matmul_and_an_in_place_buffer(kernels, runner, rng):
    m, n, k = 12, 9, 30
    lhs, rhs = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    out = run_named(kernels / "matmul.wgsl", {"lhs": lhs, "rhs": rhs, "dims": np.array([m, n, k], np.uint32)},
                    {"product": ((m, n), np.float32)}, workgroups=(2, 2, 1), runner=runner)
    np.testing.assert_allclose(out["product"], lhs @ rhs, rtol=1e-4, atol=1e-4)
    x, y = rng.standard_normal(70).astype(np.float32), rng.standard_normal(70).astype(np.float32)
    params = np.array([0.5], np.float32).tobytes() + np.array([70], np.uint32).tobytes()
    out = run_named(kernels / "axpy.wgsl", {"params": params, "x": x, "y": y}, workgroups=(2, 1, 1), runner=runner)
    assert out["y"].dtype == np.float32 and out["y"].shape == (70,)
    np.testing.assert_allclose(out["y"], np.float32(0.5) * x + y, rtol=1e-6, atol=1e-6)


def test_refusals_are_kem_errors_naming_the_buffer(kernels, runner):
    with pytest.raises(KemError) as err:
        run_named(kernels / "sumdiff.wgsl", {"a": np.zeros(4, np.uint32), "b": np.zeros(4, np.uint32)}, {"total": 16},
                  workgroups=(1, 1, 1), runner=runner)
    assert err.value.reason == "bad_args" and "output 'delta'" in err.value.detail


def test_a_script_using_the_api_prints_no_mesa_notice(tmp_path):
    """BEFORE (issue 26): a script calling kem_port.api printed Mesa's
    'error: XDG_RUNTIME_DIR is invalid or not set in the environment' twice."""
    import os
    import subprocess
    import sys

    script = "import numpy as np\nfrom kem_port import api\nassert (api.run('double', np.arange(8, dtype=np.uint32)) == np.arange(8) * 2).all()\n"
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert b"XDG_RUNTIME_DIR" not in done.stderr, done.stderr
