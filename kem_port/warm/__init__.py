"""A warm ``kem run``: one background process per user and setting keeps a
device, its compiled pipelines and the admission guard's worker, and runs
the commands later ``kem run --warm`` calls hand it (docs/cli.md, "A warm
kem run").

Why a process and not an on-disk cache (measured on lavapipe, 2 cores
under the other helpers' load): a cold ``kem run`` of a new kernel spends
0.2-0.4 s importing the command, 0.5-0.7 s importing wgpu, 0.5-1.2 s
opening the device, 1.9-2.7 s admitting the kernel (1.5-2.4 s of it
starting the sacrificial worker, which opens its own device; 0.3 s its
compile), 0.2-0.6 s compiling and 0.35-0.6 s in the first dispatch
(lavapipe builds the shader's machine code there). An on-disk verdict
would skip the admission only and leave 2-3 s; only a process that keeps
the device and the pipelines skips the rest. The warm process runs the very
same command code (``kem_port.cli.main``) with one shared
``kem_port.api.Runner``: the guard admits by the kernel's exact text,
entry point, params and constants, in memory, as a long-lived port does.

client.py: find or start the process, hand it argv, cwd and the three
standard streams (file descriptors over a Unix socket); server.py: the
process. A face of kem like the CLI: it may import any layer.
"""
