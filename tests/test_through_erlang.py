"""The whole road from Erlang: kem_nif in a real `erl`, the real port, real
wgpu, outputs checked against numpy; and a kernel fetched by Arweave ID
from the loopback gateway."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import reference
from arweave_fixture import Gateway, make_tx, new_key

ROOT = Path(__file__).resolve().parents[1]
EBIN = ROOT / "erlang" / "kem" / "_build" / "default" / "lib" / "kem" / "ebin"


@pytest.fixture(scope="module")
def erl():
    if shutil.which("erl") is None:
        pytest.skip("erl is not installed")
    if not (EBIN / "kem_nif.beam").exists():
        subprocess.run(["rebar3", "compile"], cwd=ROOT / "erlang" / "kem", check=True, capture_output=True)
    return shutil.which("erl")


def run_erl(erl: str, script: str, env: dict | None = None) -> None:
    full = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [erl, "-noshell", "-pa", str(EBIN), "-eval", script + " init:stop()."],
        env=full, capture_output=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]


def test_example_kernels_through_kem_nif(erl, tmp_path, rng):
    w, h = 123, 77
    image = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    data = rng.integers(0, 256, 10_001, dtype=np.uint8).tobytes()
    seed, strength, size = int(rng.integers(0, 2**32)), int(rng.integers(1, 50)), int(rng.integers(1, 12))
    (tmp_path / "image").write_bytes(image.tobytes())
    (tmp_path / "data").write_bytes(data)
    d = str(tmp_path)
    run_erl(erl, f"""
        {{ok, _}} = application:ensure_all_started(kem),
        {{ok, Img}} = file:read_file("{d}/image"), {{ok, Data}} = file:read_file("{d}/data"),
        P = fun(A, B) -> <<{w}:32/little, {h}:32/little, A:32/little, B:32/little>> end,
        ok = file:write_file("{d}/double", kem_nif:execute_kernel(<<"double">>, Data, 3)),
        ok = file:write_file("{d}/pixelize", kem_nif:execute_kernel_with_params(<<"pixelize">>, Img, P({size}, 0))),
        {{ok, G}} = kem:execute(<<"glitch">>, Img, #{{params => P({seed}, {strength})}}),
        ok = file:write_file("{d}/glitch", G),""")
    assert (tmp_path / "double").read_bytes() == reference.double(data, 3 * len(data))
    got = np.frombuffer((tmp_path / "pixelize").read_bytes(), dtype=np.uint8).reshape(h, w, 4)
    np.testing.assert_array_equal(got, reference.pixelize(image, size))
    got = np.frombuffer((tmp_path / "glitch").read_bytes(), dtype=np.uint8).reshape(h, w, 4)
    np.testing.assert_array_equal(got, reference.glitch(image, seed, strength))


def test_arweave_kernel_through_kem_nif(erl, tmp_path, rng):
    source = (ROOT / "kem_port" / "kernels" / "double.wgsl").read_bytes()
    gateway = Gateway()
    try:
        tx_id = gateway.publish_tx(make_tx(new_key(), source), source)
        data = rng.integers(0, 256, 999, dtype=np.uint8).tobytes()
        (tmp_path / "data").write_bytes(data)
        d = str(tmp_path)
        run_erl(erl, f"""
            {{ok, _}} = application:ensure_all_started(kem),
            {{ok, Data}} = file:read_file("{d}/data"),
            ok = file:write_file("{d}/out", kem_nif:execute_kernel(<<"{tx_id}">>, Data, 2)),""",
            env={"KEM_GATEWAYS": gateway.url, "KEM_CACHE_DIR": str(tmp_path / "cache")})
        assert (tmp_path / "out").read_bytes() == reference.double(data, 2 * len(data))
        assert gateway.count(f"/tx/{tx_id}") == 1
    finally:
        gateway.close()
