"""Files of other tools that unimatmul reads and writes, as data.

Each format lives in its own module and returns data (records, rows, documents); it
never prints, and never imports the CLI. ``tunableop`` (PyTorch TunableOp's results
and untuned files), ``tunableop_cache`` (their rows as cache entries and back),
``json_export`` (the cache as plain JSON). The commands that read and write these
files are in :mod:`unimatmul.cli.interop`.
"""
