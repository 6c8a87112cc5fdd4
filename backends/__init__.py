"""unimatmul's built-in backends, one package each, registered by entry points."""
