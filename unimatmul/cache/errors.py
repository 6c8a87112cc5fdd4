"""What can be wrong with a cache file (all of it, or one entry of it), and a write that failed."""

from __future__ import annotations

import errno


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


class NotRegularFile(CacheFileError):
    """Something other than a regular file (a FIFO, a device, a folder) is at the cache path:
    it is never read (a FIFO would block) and never replaced."""


class BadEntry(ValueError):
    """One entry's row cannot be decoded (the rest of the file is fine)."""


class CacheWriteError(OSError):
    """Pending changes could not be written to the cache file; ``str()`` says why.

    Raised by ``MsgpackFileStore.flush(strict=True)`` (and the commands that write a
    cache): the store is read-only (``UNIMATMUL_CACHE_READONLY``, a newer schema, a file
    that is not a regular file), another process held the lock past the timeout, or the
    file system refused (permissions, a full disk). ``path`` is the cache file.
    """

    def __init__(self, path: str, why: str, code: int = errno.EROFS) -> None:
        super().__init__(code, f"cannot write the cache {path}: {why}")
        self.path = path
        self.why = why

    def __str__(self) -> str:
        return str(self.strerror)
