"""Bulk bytes beside the pipe: shared-memory files in both directions
(``shm``) and the threads that move large payloads between tmpfs and
memory (``bulk_io``).

May import the top-level basics (``config``, ``errors``) only; the wire,
port and GPU layers import it (tests/test_architecture.py).
"""
