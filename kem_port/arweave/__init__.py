"""Kernels named by Arweave ID: gateways, proofs and the verified cache."""
