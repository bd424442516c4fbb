"""``python -m kem_port``: the port program.

Before anything that could print is imported (wgpu loads native libraries
at import time): descriptor 1 is taken for frames, descriptor 2 is captured
for the log pipeline (native_stderr.py), and Mesa gets a valid
``XDG_RUNTIME_DIR`` (runtime_dir.py).

A person who types ``kem-port`` (or ``kem-port --help``) at a terminal gets
a usage text instead: the port speaks length-prefixed binary frames, which
a terminal shows as garbage and which no keyboard can type.
"""

import os
import sys

USAGE = """\
usage: kem-port [-h]

kem-port is the kem port program: a HyperBEAM node (the Erlang app kem)
starts it as an Erlang port and speaks binary {packet,4} frames with it on
stdin and stdout (docs/protocol.md). It is not meant to be run by hand.

To run a kernel from a shell, use the kem command instead:
  kem run double --random 64K        run a kernel once
  kem check mykernel.wgsl            check a kernel as the port would
  kem adapters                       list the GPU adapters

Settings come from KEM_* environment variables (README: Settings).
"""


def _at_a_terminal() -> bool:
    """True when a person, not a node, started the port: a terminal on
    either protocol descriptor."""
    return any(os.isatty(fd) for fd in (0, 1))


def _usage(argv: list[str]) -> int | None:
    """The exit code for a human invocation (0 for --help, 2 for any other
    argument or a terminal), or None for a port started by its node."""
    if any(arg in ("-h", "--help") for arg in argv):
        print(USAGE, end="")
        return 0
    if argv or _at_a_terminal():
        print(USAGE, end="", file=sys.stderr)
        if argv:
            print(f"kem-port: takes no arguments (got {' '.join(argv)})", file=sys.stderr)
        return 2
    return None


def main() -> int:
    code = _usage(sys.argv[1:])
    if code is not None:
        return code
    from kem_port.port import native_stderr, runtime_dir
    from kem_port.wire.stdio_guard import claim_protocol_fds

    in_fd, out_fd = claim_protocol_fds()
    captured = native_stderr.capture()
    runtime_dir.ensure()
    from kem_port.port.server import serve

    return serve(in_fd, out_fd, captured)


if __name__ == "__main__":
    raise SystemExit(main())
