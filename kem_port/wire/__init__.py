"""The wire layer: the port's bytes in and out, and nothing past them.

Owns fd 1 (``stdio_guard``), ``{packet,4}`` framing and the frame writer
(``framing``), reading every frame kind into a typed request (``terms``,
``etf_guard``, ``request_fast``, ``protocol``, ``batch_frames``,
``group_frames``, ``session_protocol``) and encoding every reply and log
record (``terms``, ``log_frames``).

May import: the top-level basics (``config``, ``errors``, ``stats``,
``kernel_store``), ``transfer`` and the GPU layer's call types
(``gpu.calls``). Never ``port`` (tests/test_architecture.py).
"""
