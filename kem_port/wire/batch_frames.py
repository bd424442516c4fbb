"""Many calls in one frame, many results in one frame (docs/protocol.md,
"Batch frames").

When many Erlang callers wait on one port, the owner (kem_port.erl) sends
their calls as one frame and the port answers a GPU step's small results as
one frame: per call that saves a pipe write, a pipe read, a Python frame
read and a port message in Erlang on each side.

* calls: ``{calls, [Call1, Call2, ...]}`` where each ``CallN`` is a binary
  holding the ETF of one ordinary request frame (``term_to_binary({call,
  ReqId, Method, Args, TimeoutMs})``). Each item is then read exactly as a
  frame of its own (the narrow decoder, etf_guard, the ReqId peek), so a
  refused term in one call answers only that caller. The frame's outer
  structure is checked here before any item is touched: the exact head,
  at most MAX_CALLS items, every length inside the frame, nothing after the
  list. Anything else is not a batch frame and goes the ordinary way (and
  is refused there like any malformed frame).
* replies: ``{replies, Index, Blob}``: Index is a binary of
  ``<<ReqId:64, Size:32>>`` per result and Blob the results back to back,
  in Index order. Only ``{ok, Binary}`` results travel this way; errors and
  term results keep their own ``{reply, ...}`` frames.

Both are written byte by byte here (the ETF of exactly these shapes), so
neither side runs a general encoder over them, and the blob goes to
``os.writev`` from the result buffers as they are.
"""

from __future__ import annotations

import struct

import numpy as np

MAX_CALLS = 256  # items in one calls frame; the node sends at most 64
# A calls frame may be read up to this size even where KEM_MAX_INPUT_BYTES
# makes single frames smaller: the node sends at most 1 MiB of calls in one,
# each call under 64 KiB (kem_port.erl), so no call in it can be too large
# for a frame of its own.
MAX_CALLS_FRAME_BYTES = 2 << 20
_ATOM = 119  # SMALL_ATOM_UTF8_EXT, what OTP writes for these atoms
_TUPLE, _LIST, _NIL, _BINARY = 104, 108, 106, 109
CALLS_HEAD = bytes([131, _TUPLE, 2, _ATOM, 5]) + b"calls" + bytes([_LIST])
REPLIES_HEAD = bytes([131, _TUPLE, 3, _ATOM, 7]) + b"replies" + bytes([_BINARY])
_U32 = struct.Struct(">I")
_INDEX_ENTRY = struct.Struct(">QI")
_INDEX_RECORD = np.dtype([("req_id", ">u8"), ("size", ">u4")])  # _INDEX_ENTRY as numpy records
_u32 = _U32.unpack_from


def is_calls_frame(frame: bytes) -> bool:
    return frame.startswith(CALLS_HEAD)


def split_calls(frame: bytes) -> list[bytes] | None:
    """The request frames inside a calls frame, or None when frame is not a
    well-formed one (then it is read as an ordinary frame, and refused)."""
    if not frame.startswith(CALLS_HEAD):
        return None
    pos = len(CALLS_HEAD)
    end = len(frame)
    if pos + 4 > end:
        return None
    (count,) = _u32(frame, pos)
    pos += 4
    if not 0 < count <= MAX_CALLS:
        return None
    items: list[bytes] = []
    for _ in range(count):
        if pos + 5 > end or frame[pos] != _BINARY:
            return None
        (size,) = _u32(frame, pos + 1)
        start = pos + 5
        pos = start + size
        if pos > end:
            return None
        items.append(frame[start:pos])
    if pos + 1 != end or frame[pos] != _NIL:
        return None
    return items


def encode_calls(frames: list[bytes]) -> bytes:
    """A calls frame holding these request frames (the client and tests;
    the node writes the same bytes in kem_port.erl)."""
    parts = [CALLS_HEAD, _U32.pack(len(frames))]
    for frame in frames:
        parts += [bytes([_BINARY]), _U32.pack(len(frame)), frame]
    parts.append(bytes([_NIL]))
    return b"".join(parts)


def replies_frame(results: list[tuple[int, bytes | memoryview]]) -> list[bytes | memoryview]:
    """Buffers that together encode ``{replies, Index, Blob}`` for results
    of (ReqId, payload); the payloads are not copied."""
    index = b"".join([_INDEX_ENTRY.pack(req_id, len(data)) for req_id, data in results])
    blob = sum(len(data) for _, data in results)
    head = REPLIES_HEAD + _U32.pack(len(index)) + index + bytes([_BINARY]) + _U32.pack(blob)
    return [head, *(data for _, data in results)]


def uniform_replies_frame(req_ids: np.ndarray, size: int, blob: bytes | memoryview) -> list[bytes | memoryview]:
    """``{replies, Index, Blob}`` for results of one size (a group's,
    group_calls.py): the Index built with numpy as ``>u8,>u4`` records, the
    blob not copied."""
    index = np.empty(len(req_ids), _INDEX_RECORD)
    index["req_id"] = req_ids
    index["size"] = size
    head = REPLIES_HEAD + _U32.pack(index.nbytes) + index.tobytes() + bytes([_BINARY]) + _U32.pack(len(blob))
    return [head, blob]


def split_replies(frame: bytes) -> list[tuple[int, bytes]] | None:
    """(ReqId, payload) of each result in a replies frame; None when frame
    is not one (the client and tests; kem_port.erl matches the bytes)."""
    if not frame.startswith(REPLIES_HEAD) or len(frame) < len(REPLIES_HEAD) + 4:
        return None
    pos = len(REPLIES_HEAD)
    (index_size,) = _u32(frame, pos)
    index_at = pos + 4
    blob_head = index_at + index_size
    if index_size % _INDEX_ENTRY.size or blob_head + 5 > len(frame) or frame[blob_head] != _BINARY:
        return None
    (blob_size,) = _u32(frame, blob_head + 1)
    at = blob_head + 5
    if at + blob_size != len(frame):
        return None
    results = []
    for req_id, size in _INDEX_ENTRY.iter_unpack(frame[index_at:blob_head]):
        results.append((req_id, frame[at : at + size]))
        at += size
    return results if at == len(frame) else None
