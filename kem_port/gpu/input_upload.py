"""Writing a batch's inputs into its input buffer (plan.BatchPlan.upload):
a group's slots with one numpy copy, large inputs without a copy, inputs
still in their file read straight into an upload buffer. Padding up to a
slot's stride or a binding's size is written as zeros: every bound range
holds its call's bytes and zeros, never an earlier batch's leftovers.
"""

from __future__ import annotations

import numpy as np

from kem_port.transfer.file_inputs import FileInput, FileParts

# An `item` here is a plan.Prepared (plan imports this module).


def _slots(item) -> tuple[np.ndarray, int]:
    """A group job's inputs as an (N, S) array, and S."""
    size = len(item.job.call.input)
    return np.frombuffer(item.job.inputs, np.uint8).reshape(item.job.calls, size), size


def pack_slots(packed: bytearray, item) -> None:
    """A group's N inputs into its N slots of the packed upload, one numpy
    copy (the padding between slots stays the bytearray's zeros)."""
    inputs, size = _slots(item)
    stride = item.in_stride
    slots = np.frombuffer(packed, np.uint8, item.job.calls * stride, item.in_offset).reshape(-1, stride)
    slots[:, :size] = inputs


def write_slots(hot, buf, item) -> None:
    """A group of large inputs: written as they are when the slots need no
    padding, else padded into one array first."""
    inputs, size = _slots(item)
    if size == item.in_stride:
        hot.write(buf, item.in_offset, item.job.inputs)
        return
    padded = np.zeros((item.job.calls, item.in_stride), np.uint8)
    padded[:, :size] = inputs
    hot.write(buf, item.in_offset, padded)


def upload_file(hot, in_buf, data: FileInput | FileParts, item, take) -> tuple | None:
    """One host copy: the file read straight into a write-mapped upload
    buffer, zero-padded (the GPU copies it into the input buffer). Without
    map_write (wgpu-py's objects) two: read into memory, then write_buffer."""
    size = item.in_size
    if take is None or not hasattr(hot, "map_write"):
        view = memoryview(bytearray(size))
        data.read_into(view)
        hot.write(in_buf, item.in_offset, view)
        return None
    upload = take("upload", size)
    hot.wait_idle_map(hot.map_write(upload, 0, size))
    try:
        view = hot.writable(upload, 0, size)
        data.read_into(view)
        view[data.size : size] = bytes(size - data.size)
    finally:
        hot.unmap(upload)
    return (upload, item.in_offset, size)


def write_padded(hot, buf, data: bytes, offset: int, padded: int) -> None:
    """Upload data at offset and zero the bytes up to `padded`, without
    copying data (write_buffer reads the caller's buffer directly)."""
    body = len(data) // 4 * 4
    if body:
        hot.write(buf, offset, data, body)
    tail = padded - body
    if tail:
        hot.write(buf, offset + body, bytes(data[body:]) + bytes(tail - (len(data) - body)))
