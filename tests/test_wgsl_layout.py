"""Uniform sizes (gpu/wgsl_layout.py) against wgpu's own rule, and too few
params refused with a clear error instead of silent zeros (issue 12)."""

from __future__ import annotations

import numpy as np
import pytest
import wgpu

from kem_port.client import PortError
from kem_port.gpu.wgsl.wgsl_reflect import reflect

# (declarations, uniform type, bytes by WGSL's uniform layout rules)
CASES = [
    ("struct P { w: u32, h: vec2<f32>, a: array<vec4<u32>, 2> }", "P", 48),
    ("struct I { x: u32 }\nstruct P { a: vec4<u32>, s: I }", "P", 32),
    ("struct P { m: mat3x3<f32>, v: vec3f }", "P", 64),
    ("struct P { a: u32, b: u32, c: u32, d: u32 }", "P", 16),
    ("struct P { add: u32, }", "P", 4),
    ("", "vec3<f32>", 12),
    ("", "array<vec4u, 3>", 48),
]


def _kernel(decls: str, type_text: str) -> str:
    return f"""{decls}
@group(0) @binding(0) var<uniform> p: {type_text};
@group(0) @binding(1) var<storage, read_write> o: array<u32>;
@compute @workgroup_size(1) fn main() {{ let q = p; o[0] = 1u; }}
"""


@pytest.fixture(scope="module")
def device():
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    return adapter.request_device_sync()


def _wgpu_accepts(device, source: str, size: int) -> bool:
    """Whether wgpu lets a dispatch bind `size` bytes of uniform: its late
    binding check compares with the size it derives from the shader."""
    pipe = device.create_compute_pipeline(
        layout="auto", compute={"module": device.create_shader_module(code=source), "entry_point": "main"}
    )
    uniform = device.create_buffer(size=256, usage=wgpu.BufferUsage.UNIFORM)
    out = device.create_buffer(size=16, usage=wgpu.BufferUsage.STORAGE)
    try:
        group = device.create_bind_group(
            layout=pipe.get_bind_group_layout(0),
            entries=[
                {"binding": 0, "resource": {"buffer": uniform, "offset": 0, "size": size}},
                {"binding": 1, "resource": {"buffer": out, "offset": 0, "size": 16}},
            ],
        )
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(pipe)
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(1)
        compute.end()
        device.queue.submit([encoder.finish()])
        return True
    except wgpu.GPUError:
        return False


@pytest.mark.parametrize("decls,type_text,size", CASES)
def test_uniform_size_matches_wgpu(device, decls, type_text, size):
    source = _kernel(decls, type_text)
    assert reflect(source).binding(0, 0).min_size == size
    assert _wgpu_accepts(device, source, size)
    if size > 4:  # wgpu-native aborts on a zero-sized binding: never ask it that
        assert not _wgpu_accepts(device, source, size - 4)


def test_unknown_layouts_are_not_guessed():
    aliased = "alias T = vec4<u32>;\n@group(0) @binding(2) var<uniform> p: T;"
    sized = "struct P { @size(32) a: u32 }\n@group(0) @binding(2) var<uniform> p: P;"
    assert reflect(aliased).binding(0, 2).min_size is None
    assert reflect(sized).binding(0, 2).min_size is None


def test_too_few_params_is_a_clear_error(port, rng):
    width, height = 8, 6
    image = rng.integers(0, 256, size=width * height * 4, dtype=np.uint8).tobytes()
    short = np.array([width, height], dtype="<u4").tobytes()  # pixelize reads 4 words
    with pytest.raises(PortError) as err:
        port.call("execute_kernel_with_params", b"pixelize", image, short)
    assert err.value.reason == "bad_args"
    assert "16 bytes" in err.value.detail
    full = np.array([width, height, 1, 0], dtype="<u4").tobytes()
    assert port.call("execute_kernel_with_params", b"pixelize", image, full) == image


def test_too_few_params_is_refused_on_every_call_not_only_the_first(rng):
    """The check ran where the pipeline is compiled: once pixelize was
    cached, short params ran on zeros. Calls and session calls, both orders."""
    from conftest import start_port

    width, height = 8, 6
    image = rng.integers(0, 256, size=width * height * 4, dtype=np.uint8).tobytes()
    full = np.array([width, height, 1, 0], dtype="<u4").tobytes()
    short = full[:8]
    with start_port() as port:
        session = port.session_open()
        for _ in range(2):  # the first round compiles, the second hits the caches
            assert port.call("execute_kernel_with_params", b"pixelize", image, full) == image
            assert session.call("pixelize", image, params=full) == image
            for run in (lambda: port.call("execute_kernel_with_params", b"pixelize", image, short),
                        lambda: session.call("pixelize", image, params=short)):
                with pytest.raises(PortError) as err:
                    run()
                assert err.value.reason == "bad_args" and "16 bytes" in err.value.detail
