"""``kem playground``: a local page for kernel authors (docs/playground.md).

A WGSL editor that checks as you type, inputs from a PNG, a file or random
bytes, Run, the output as an image or hex, the dispatch rule, timings and
debug records. It is a face of kem like the CLI (it may import any layer;
nothing imports it): the server (server.py) answers on 127.0.0.1 only and
hands every request to one Bench (bench.py), which holds one
``kem_port.api.Runner`` -- one device -- for the server's life, so every
Run after the first is warm. The page is static/ (plain HTML, CSS and JS,
no CDN: the playground must work offline and a local tool that loads code
from a third party at each start hands that party the author's kernels).
"""
