"""kem: HyperBEAM's kernel execution machine, as an Erlang port server.

The node runs ``python -m kem_port`` as a port; requests arrive as Erlang
terms in ``{packet,4}`` frames and WGSL compute kernels run through wgpu.
docs/protocol.md is the wire contract.
"""

__version__ = "0.2.0"
