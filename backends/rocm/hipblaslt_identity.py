"""What a hipBLASLt candidate's identity is made of, for the dense and the grouped candidates.

The backend's name (the first part of every identity) and the fingerprint of a solution's
name (:func:`name_fingerprint`), in one module that both the backend (:mod:`.hipblaslt`)
and its grouped candidates (:mod:`.hipblaslt_grouped`) import, so neither imports the other
for it.
"""

from __future__ import annotations

import hashlib

NAME = "hipblaslt"


def name_fingerprint(name: str) -> str:
    """16 hex digits of the SHA-256 of a solution's name: what an identity stores of it.

    Names are long (~500 characters) and a record keeps every candidate it measured, so a
    fingerprint, not the text, rides in the identity; it is compared, never read back.
    """
    return hashlib.sha256(name.encode()).hexdigest()[:16]
