"""Routing PyTorch matmuls through unimatmul (in progress)."""
