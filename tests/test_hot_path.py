"""The batch hot path (kem_port/gpu/hot_path.py) on a real device, both
ways: wgpu-native's C API (kem_port/gpu/native.py), whose every
private member must be present (named if not), and wgpu-py's public
objects. Batches run through either match numpy; errors come back as
wgpu.GPUError, not crashes."""

from __future__ import annotations

import numpy as np
import pytest
import wgpu

from kem_port.gpu import hot_path, wgpu_private
from kem_port.gpu.native import NativePath

U = wgpu.BufferUsage
ALIGN = 256
KERNEL = """
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&output_words)) { output_words[gid.x] = input_words[gid.x] * 3u + 7u; }
}
"""


def test_every_private_member_the_fast_path_needs_is_present():
    gone = wgpu_private.missing_native_members()
    assert gone == [], f"wgpu-py {wgpu.__version__} lacks {gone}: fix kem_port/gpu/wgpu_private.py or pin wgpu"
    assert hot_path.name(hot_path.choose(wgpu.gpu.request_adapter_sync().request_device_sync())) == "native"


@pytest.fixture(scope="module")
def device():
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    return adapter.request_device_sync()


@pytest.fixture(scope="module", params=["native", "wrappers"])
def native(device, request):
    path = hot_path.choose(device, request.param)
    assert isinstance(path, NativePath if request.param == "native" else hot_path.WrapperPath)
    assert wgpu_private.missing_handles([device, device.queue]) == []
    return path


def test_an_unknown_hot_path_setting_is_refused(device):
    with pytest.raises(ValueError, match="KEM_HOT_PATH"):
        hot_path.choose(device, "fast")


@pytest.fixture(scope="module")
def pipeline(device):
    module = device.create_shader_module(code=KERNEL)
    return device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})


def _layout(sizes: list[int]) -> tuple[list[int], int]:
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += -(-size * 4 // ALIGN) * ALIGN
    return offsets, total


@pytest.mark.parametrize("spin_s", [0.0, 0.002], ids=["blocking", "spin"])
def test_a_packed_batch_through_the_c_api_matches_numpy(device, native, pipeline, rng, spin_s):
    sizes = [1, 3, 64, 65, 1000, 4096]  # words per call: under, at and over a workgroup
    offsets, total = _layout(sizes)
    inputs = [rng.integers(0, 2**31, size=n, dtype=np.uint32) for n in sizes]
    packed = bytearray(total)
    for data, offset in zip(inputs, offsets):
        packed[offset : offset + data.nbytes] = data.tobytes()
    in_buf = device.create_buffer(size=total, usage=U.STORAGE | U.COPY_DST)
    out_buf = device.create_buffer(size=total, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
    staging = device.create_buffer(size=total, usage=U.MAP_READ | U.COPY_DST)
    layout = pipeline.get_bind_group_layout(0)
    for _round in range(3):  # the same buffers again: the map/unmap cycle repeats cleanly
        native.write(in_buf, 0, packed)
        encoder = native.encoder()
        encoder.clear_buffer(out_buf, 0, total)
        encoder.begin_pass()
        encoder.set_pipeline(pipeline)
        for n, offset in zip(sizes, offsets):
            group = device.create_bind_group(layout=layout, entries=[
                {"binding": 0, "resource": {"buffer": in_buf, "offset": offset, "size": n * 4}},
                {"binding": 1, "resource": {"buffer": out_buf, "offset": offset, "size": n * 4}},
            ])
            encoder.set_bind_group(group)
            encoder.dispatch(-(-n // 64))
        encoder.end_pass()
        encoder.copy(out_buf, 0, staging, 0, total)
        index = native.submit(encoder.finish())
        native.wait(native.map_read(staging, 0, total), spin_s, index)
        view = native.mapped(staging, 0, total)
        for data, n, offset in zip(inputs, sizes, offsets):
            got = np.frombuffer(view[offset : offset + n * 4], dtype=np.uint32)
            np.testing.assert_array_equal(got, data * 3 + 7)
        native.unmap(staging)


def test_write_reads_a_slice_of_any_buffer_object(device, native, rng):
    data = rng.integers(0, 2**32, size=300, dtype=np.uint32)
    buf = device.create_buffer(size=data.nbytes, usage=U.COPY_DST | U.COPY_SRC)
    native.write(buf, 0, memoryview(data.tobytes())[: 256 * 4], 256 * 4)
    native.write(buf, 256 * 4, data[256:])  # a numpy array, no copy
    assert np.array_equal(np.frombuffer(device.queue.read_buffer(buf), dtype=np.uint32), data)


def test_a_bad_copy_is_a_gpu_error_at_finish_and_the_path_still_works(device, native):
    small = device.create_buffer(size=256, usage=U.COPY_SRC | U.COPY_DST)
    staging = device.create_buffer(size=256, usage=U.MAP_READ | U.COPY_DST)
    encoder = native.encoder()
    encoder.copy(small, 0, staging, 0, 4096)  # past both buffers' ends
    with pytest.raises(wgpu.GPUError):
        encoder.finish()
    with pytest.raises((wgpu.GPUError, ValueError)):  # the wrappers check in Python first
        native.write(small, 200, bytes(512))  # past the end
    native.write(small, 0, b"\x05\x00\x00\x00")
    encoder = native.encoder()
    encoder.copy(small, 0, staging, 0, 256)
    index = native.submit(encoder.finish())
    native.wait(native.map_read(staging, 0, 256), 0.0, index)
    assert bytes(native.mapped(staging, 0, 4)) == b"\x05\x00\x00\x00"
    native.unmap(staging)


def test_mapping_a_buffer_that_cannot_be_mapped_is_refused(device, native):
    not_mappable = device.create_buffer(size=256, usage=U.COPY_DST)
    with pytest.raises(wgpu.GPUError):
        native.wait(native.map_read(not_mappable, 0, 256), 0.0)


def test_a_map_nobody_waits_for_any_more_is_safe_to_complete(device):
    """wgpu-native calls back for a map even when its waiter is gone (a
    failed batch, a refused map): the callback must find its object alive."""
    import gc

    path = hot_path.choose(device, "native")
    staging = device.create_buffer(size=256, usage=U.MAP_READ | U.COPY_DST)
    not_mappable = device.create_buffer(size=256, usage=U.COPY_DST)
    path.map_read(staging, 0, 256)  # dropped at once
    with pytest.raises(wgpu.GPUError):
        path.map_read(not_mappable, 0, 256)
    gc.collect()
    for _ in range(100):
        path.poll(True)
        if not path._pending:
            break
    assert not path._pending
    path.unmap(staging)
