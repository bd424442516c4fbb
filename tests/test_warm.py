"""The ``warm`` method: a restarted port compiles the kernels it is told
about (and the pinned ones it has) before serving, through the same
pipeline cache the calls use; unknown or broken kernels are skipped."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import start_port
from reference import double as double_ref

from kem_port.client import PortError
from kem_port.wire.terms import atom_name

BROKEN = "@compute @workgroup_size(1) fn main() { let x: u32 = ; }\n"


def _counts(reply: dict) -> dict[str, int]:
    return {atom_name(k): v for k, v in reply.items()}



def test_warm_compiles_known_shapes_and_skips_the_rest(kernel_dir, rng):
    (kernel_dir / "broken.wgsl").write_text(BROKEN)
    shapes = [
        (b"double", b"main", False),
        (b"pixelize", b"main", True),
        (b"no_such_kernel", b"main", False),
        (b"broken", b"main", False),
        (b"double", b"not_an_entry", False),
        (b"double", b"main", False),  # a repeat is compiled once
    ]
    with start_port(KEM_KERNEL_DIR=str(kernel_dir)) as port:
        first = _counts(port.call("warm", shapes))
        assert first == {"compiled": 2, "cached": 0, "skipped": 3}
        again = _counts(port.call("warm", shapes))
        assert again == {"compiled": 0, "cached": 2, "skipped": 3}
        for size in (4, 1000, 65537):
            data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            assert port.call("execute_kernel", b"double", data, 1) == double_ref(data, size)


def test_warmed_kernel_is_not_compiled_again(rng):
    with start_port() as port:
        assert _counts(port.call("warm", [(b"double", b"main", False)]))["compiled"] == 1
        before = port.call("stats")
        data = rng.integers(0, 256, 4099, dtype=np.uint8).tobytes()
        assert port.call("execute_kernel", b"double", data, 2) == double_ref(data, 2 * 4099)
        after = port.call("stats")
        assert _stat(after, "compiles") == _stat(before, "compiles") == 1
        assert (_stat(after, "pipeline_hits") or 0) > (_stat(before, "pipeline_hits") or 0)


def _stat(stats: dict, name: str) -> int | None:
    """A counter anywhere in the stats map (keys are atoms)."""
    for key, value in stats.items():
        if atom_name(key) == name:
            return value
        if isinstance(value, dict):
            found = _stat(value, name)
            if found is not None:
                return found
    return None


@pytest.mark.parametrize(
    "args",
    [(), ([(b"double", b"main")],), ([(b"../x", b"main", False)],), ([(b"double", b"main", 1)],), (b"double",)],
)
def test_malformed_warm_is_bad_args(port, args):
    with pytest.raises(PortError) as err:
        port.call("warm", *args)
    assert err.value.reason == "bad_args"
    assert port.call("ping") is not None
