"""The wgpu-py private members kem uses (kem_port/gpu/wgpu_private.py) are
all still there; a wgpu upgrade that removes one fails here, naming it."""

from __future__ import annotations

import numpy as np
import wgpu

from kem_port.config import Config
from kem_port.gpu import wgpu_private
from kem_port.gpu.device import Device
from kem_port.stats import Stats


def test_every_private_member_kem_uses_exists():
    missing = wgpu_private.missing_members()
    assert missing == [], f"wgpu-py {wgpu.__version__} lacks {', '.join(missing)}: see kem_port/gpu/wgpu_private.py"
    assert len(wgpu_private.MEMBERS) == 4


def test_the_private_members_work_on_the_real_device(rng):
    """Write, map unsynced, poll both ways: the bytes come back."""
    gpu = Device(Config(), Stats())
    gpu.open()
    device = gpu.require()
    data = rng.integers(0, 256, 1024, dtype=np.uint8).tobytes()
    staging = device.create_buffer(size=len(data), usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
    source = device.create_buffer_with_data(data=data, usage=wgpu.BufferUsage.COPY_SRC)
    encoder = device.create_command_encoder()
    encoder.copy_buffer_to_buffer(source, 0, staging, 0, len(data))
    device.queue.submit([encoder.finish()])
    promise = wgpu_private.map_for_reading_unsynced(staging, len(data))
    wgpu_private.poll_without_blocking(device)
    if wgpu_private.is_pending(promise):
        wgpu_private.poll_until_idle(device)
    assert not wgpu_private.is_pending(promise)
    promise.sync_wait()
    assert bytes(staging.read_mapped(0, len(data))) == data
    staging.unmap()
    wgpu_private.tag_serial(staging, 41)
    assert wgpu_private.serial_of(staging) == 41
