"""The unimatmul conformance suite: a pytest plugin, opt-in (in progress)."""
