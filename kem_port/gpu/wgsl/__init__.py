"""What a kernel's WGSL text is: its one canonical text and tokens
(``wgsl_canonical``), what it declares (``wgsl_reflect``, tree-sitter),
its call graph and whether an entry point may loop (``wgsl_calls``), the
byte size of a uniform's type (``wgsl_layout``), and its gas form: every
loop counted and capped (``wgsl_gas``, docs/metering.md).

Pure text analysis: imports nothing else of ``gpu`` and no wgpu object.
"""
