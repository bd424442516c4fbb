"""``python -m kem_port``: the port program.

Descriptor 1 is taken for frames before anything that could print is
imported (wgpu loads native libraries at import time).
"""

from kem_port.stdio_guard import claim_protocol_fds


def main() -> int:
    in_fd, out_fd = claim_protocol_fds()
    from kem_port.server import serve

    return serve(in_fd, out_fd)


if __name__ == "__main__":
    raise SystemExit(main())
