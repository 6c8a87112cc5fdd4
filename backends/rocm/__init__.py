"""The AMD ROCm backends: hipBLASLt (on the shared Lt driver) and rocBLAS."""
