"""The NVIDIA cuBLASLt backend (through nvmath-python's raw bindings)."""
