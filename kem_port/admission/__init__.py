"""Admission of kernels the port has not compiled before (docs/security.md):
refusals remembered on disk (rejects), structural limits (limits), the
workgroup-clearing rewrite (zeroing, probe), and the sacrificial compile
worker (worker, worker_client) that guard.py puts them through."""
