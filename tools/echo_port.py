"""``python tools/echo_port.py``: kem's transport without a GPU, the ceiling
the benchmark compares against.

Same framing, codec and reply fast path as the real port; a kernel call is
answered with its own input bytes, so a round trip moves the same payload
both ways and does no GPU work.
"""

from __future__ import annotations

import os

from kem_port.stdio_guard import claim_protocol_fds


def main() -> int:
    in_fd, out_fd = claim_protocol_fds()
    from kem_port import terms
    from kem_port.framing import FrameWriter, read_frame
    from kem_port.protocol import version_info

    writer = FrameWriter(out_fd)
    while True:
        frame = read_frame(in_fd, 1 << 31)
        if frame is None:
            os._exit(0)
        _, req_id, method, args = terms.decode(frame)[:4]  # a 5th element: the call's timeout
        name = terms.atom_name(method)
        if name in ("execute_kernel", "execute_kernel_with_params", "execute"):
            writer.write(terms.ok_binary_reply(req_id, terms.binary_bytes(args[1])))
        elif name == "version":  # the node's start-up check, as the real port answers it
            writer.write([terms.ok_reply(req_id, version_info())])
        else:
            writer.write([terms.ok_reply(req_id, terms.atom("pong"))])


if __name__ == "__main__":
    raise SystemExit(main())
