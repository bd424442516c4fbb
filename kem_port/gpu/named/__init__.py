"""Any kernel as its author wrote it (issue 25): buffers bound by the WGSL
variable's name at any group and binding (``binding_model``), run in one
submission (``named_run``). Part of the GPU layer: it imports what the GPU
layer may (tests/test_architecture.py)."""
