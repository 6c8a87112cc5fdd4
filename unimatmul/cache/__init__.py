"""The Cache: tuning records, the store protocol, and the default store (one msgpack file).

``record`` (TuningRecord), ``protocol`` (CacheStore, MemoryStore, open_store),
``lru`` (the in-process bound map), ``lock`` (the cross-process file lock),
``codec`` (the file's encoding) and ``file_store`` (MsgpackFileStore).
"""
