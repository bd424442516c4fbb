"""``python tools/echo_port.py``: kem's transport without a GPU, the ceiling
the benchmark compares against.

Same framing, codec and reply fast path as the real port, calls frames,
group frames and replies frames included (kem_port/batch_frames.py,
kem_port/group_frames.py); a kernel call is
answered with its own input bytes, so a round trip moves the same payload
both ways and does no GPU work.
"""

from __future__ import annotations

import os

from kem_port.wire.stdio_guard import claim_protocol_fds


def main() -> int:
    in_fd, out_fd = claim_protocol_fds()
    from kem_port.wire.batch_frames import split_calls
    from kem_port.wire.framing import FrameWriter, read_frame
    from kem_port.wire.group_frames import read_fields, req_ids_of

    from kem_port.config import Config
    from kem_port.wire.stdio_guard import input_waiting, spin_for_input

    answer = answerer()
    writer = FrameWriter(out_fd)
    waiting, spin_s = input_waiting(in_fd), Config.from_env().read_spin_us / 1e6  # the port's reader spins alike
    while True:
        if spin_s:
            spin_for_input(waiting, spin_s)
        frame = read_frame(in_fd, 1 << 31)
        if frame is None:
            os._exit(0)
        group = read_fields(frame)
        if group is not None:
            writer.replies_frames = True
            echo_group(writer, req_ids_of(group.entries) or [], group.inputs)
            continue
        calls = split_calls(frame)
        if calls is None:
            answer(writer, frame)
            continue
        writer.replies_frames = True
        with writer.gathered():  # the real port answers a calls frame's results as one replies frame
            for request in calls:
                answer(writer, request)


def echo_group(writer, req_ids: list[int], inputs: memoryview) -> None:
    """Each call of a group frame answered with its own input, all in one
    replies frame as the real port answers a group."""
    if not req_ids or len(inputs) % len(req_ids):
        return
    size = len(inputs) // len(req_ids)
    with writer.gathered():
        for i, req_id in enumerate(req_ids):
            writer.write_result(req_id, bytes(inputs[i * size : (i + 1) * size]))


def answerer():
    """Answers one request frame (imported late: stdout is claimed first)."""
    from kem_port.wire import terms
    from kem_port.wire.protocol import version_info

    def answer(writer, frame: bytes) -> None:
        _, req_id, method, args = terms.decode(frame)[:4]  # a 5th element: the call's timeout
        name = terms.atom_name(method)
        if name in ("execute_kernel", "execute_kernel_with_params", "execute"):
            writer.write_result(req_id, terms.binary_bytes(args[1]))
        elif name == "version":  # the node's start-up check, as the real port answers it
            writer.write([terms.ok_reply(req_id, version_info())])
        else:
            writer.write([terms.ok_reply(req_id, terms.atom("pong"))])

    return answer


if __name__ == "__main__":
    raise SystemExit(main())
