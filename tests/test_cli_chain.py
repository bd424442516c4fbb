"""``kem chain STEPS.json`` (kem_port/cli/chain_cmd.py): a chain file run on
a real local port, results against numpy, errors in the port's words."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import reference

KERNELS = Path(__file__).resolve().parent / "session_kernels"


def kem(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kem_port.cli", "-q", *args], cwd=cwd, capture_output=True, timeout=120)


@pytest.mark.parametrize("n", [16, 512])
def test_bitonic_sort_from_a_chain_file(tmp_path, rng, n):
    data = rng.integers(0, 2**32, n, dtype=np.uint32)
    (tmp_path / "data.bin").write_bytes(data.tobytes())
    kernel = str(KERNELS / "bitonic_pass.wgsl")
    steps, k = [], 2
    while k <= n:
        j = k // 2
        while j >= 1:
            steps += [{"kernel": kernel, "buffers": {"pass_": [k, j]}, "grid": [n, 1, 1]},
                      {"copy": ["dst", 0, "src", 0, 4 * n]}]
            j //= 2
        k *= 2
    chain = {"buffers": {"src": "@data.bin", "dst": f"zeros:{4 * n}"}, "steps": steps, "return": ["src"]}
    (tmp_path / "sort.json").write_text(json.dumps(chain))
    done = kem("chain", "sort.json", "--out-dir", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "src.bin").read_bytes() == np.sort(data).tobytes()


def test_kernel_copy_kernel_to_one_output(tmp_path, rng):
    size = int(rng.integers(1, 3000)) * 4
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    (tmp_path / "in.bin").write_bytes(data)
    chain = {"buffers": {"keep": f"zeros:{size}"}, "input": "@in.bin",
             "steps": [{"kernel": "double", "output": "t"}, {"copy": ["t", 0, "keep", 0, size]},
                       {"kernel": "double", "input": "keep"}]}
    (tmp_path / "c.json").write_text(json.dumps(chain))
    done = kem("chain", "c.json", "-o", "out.bin", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.bin").read_bytes() == reference.double(reference.double(data, size), size)


def test_errors_are_the_ports_and_name_the_step(tmp_path):
    cases = [
        ({"buffers": {"a": "zeros:64", "b": "zeros:64"}, "steps": [{"copy": ["a", 0, "b", 0, 64]}, {"copy": ["a", 0, "a", 32, 16]}]},
         "kem: step 2: bad_args: copy from 'a' to itself"),
        ({"buffers": {"a": "zeros:64"}, "steps": [{"clear": ["nope", 0, 4]}]}, "kem: step 1: no_buffer: no buffer 'nope'"),
        ({"steps": [{"kernel": "double", "colour": 1}]}, "kem: step 1: bad_args: unknown step key"),
        ({"steps": "copy"}, "a chain file is an object with steps"),
        ({"buffers": {"a": "nonsense"}, "steps": []}, "buffer a: bytes are"),
    ]
    for chain, words in cases:
        (tmp_path / "c.json").write_text(json.dumps(chain))
        done = kem("chain", "c.json", cwd=tmp_path)
        assert done.returncode == 1 and words in done.stderr.decode(), (chain, done.stderr)
