"""What can be wrong with a cache file: all of it, or one entry of it."""

from __future__ import annotations


class CacheFileError(ValueError):
    """The cache file is not a unimatmul cache this version can read."""


class NewerSchemaError(CacheFileError):
    """The file was written by a newer unimatmul whose format this one cannot read."""

    def __init__(self, schema: int, version: str, supported: int) -> None:
        super().__init__(
            f"cache file schema {schema} is newer than this unimatmul ({version}) understands "
            f"({supported}); it is left untouched and never overwritten"
        )
        self.schema = schema


class BadEntry(ValueError):
    """One entry's row cannot be decoded (the rest of the file is fine)."""
