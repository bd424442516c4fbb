"""The GPU layer: running checked kernel calls on a wgpu device.

It imports nothing from the wire layer (protocol, terms, framing, router,
shm, erlang-py); tests/test_architecture.py enforces it. docs/architecture.md
says which file answers which question.
"""
