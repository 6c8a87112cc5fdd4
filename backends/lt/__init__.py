"""The Lt driver shared by cuBLASLt and hipBLASLt, with a per-library ABI table."""
