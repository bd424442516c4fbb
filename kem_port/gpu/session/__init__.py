"""State that stays on the GPU: sessions' named buffers (``sessions``,
``session_contract``, ``session_pipelines``), chains validated whole and
run as one submission (``chain_steps``, ``chain_plan``, ``chain_bind``,
``chain_copy``, ``chain_budget``, ``chain``), and
the service the GPU thread runs them through (``session_service``).
"""
