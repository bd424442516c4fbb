"""The port process: what a request does once it is read.

Owns the reader loop (``server``), routing (``router``), a kernel call's
road to the GPU loop (``intake``: budget, source, admission; the lone
call's fold and inline run), the GPU thread (``gpu_loop``, ``batching``),
sessions' and chains' methods, the quick methods (``health``,
``call_state``, ``warm``, ``debug_calls``, ``test_hooks``) and the
process's own set-up (``native_stderr``, ``runtime_dir``).

May import every other layer; nothing imports it but the package face
(``__main__``, ``api``) (tests/test_architecture.py).
"""
