"""The GPU layer: running checked kernel calls on a wgpu device.

Here: the device, pipelines and buffer pool; the call types (``calls``);
the executor and its batch road (``executor``, ``plan``, ``batch``,
``input_upload``, ``dispatch``, ``blame``, ``wait``, ``timing``), the
native calls behind it (``hot_path``, ``native``, ``wgpu_private``) and
the lone call's kits (``lone_road``, ``lone_kit``). Subpackages: ``wgsl``
(text analysis), ``group`` (many calls in one dispatch), ``session``
(resident buffers and chains).

May import the top-level basics (``config``, ``errors``, ``stats``,
``kernel_store``) and ``transfer``; never ``wire``, ``port`` or erlang-py
(tests/test_architecture.py).
"""
