"""The loose fields of a cache file (its header, a namespace's name and platform facts),
checked before anything uses them.

They describe the entries rather than hold them, so a bad one costs only itself: it is
dropped, with a sentence saying what was wrong, and the entries are read as usual. (The
header is outside every checksum: it must be checked, never trusted.)
"""

from __future__ import annotations

import math
from typing import Any

from unimatmul.cache.record import check_settings

MAX_TEXT = 4096  # a header text or a platform fact; a namespace name


LATEST_DATE = 1e10  # Unix seconds in the year 2286: a later date is not one


HEADER_TEXT = ("writer",)


HEADER_DATES = ("created", "updated")


PLATFORM_TEXT = ("vendor", "arch", "device", "array")


def clean_header(raw: Any) -> tuple[dict[str, Any], list[str]]:
    """The header fields this reader knows, each of the right type; and what was dropped."""
    if not isinstance(raw, dict):
        return {}, [f"the header is not a map ({type(raw).__name__}); ignored"]
    header: dict[str, Any] = {}
    problems: list[str] = []
    for name in HEADER_TEXT:
        if name in raw:
            value = raw[name]
            if _text(value):
                header[name] = value
            else:
                problems.append(f"header field {name!r} is not a short text; ignored")
    for name in HEADER_DATES:
        if name in raw:
            value = raw[name]
            if is_date(value):
                header[name] = float(value)
            else:
                problems.append(f"header field {name!r} is not a date ({_short(value)}); ignored")
    if "entries" in raw:
        value = raw["entries"]
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            header["entries"] = value
        else:
            problems.append(f"header field 'entries' is not a count ({_short(value)}); ignored")
    return header, problems


def clean_platform(raw: Any, where: str) -> tuple[dict[str, Any], list[str]]:
    """A namespace's platform facts, the known ones type-checked; and what was dropped."""
    if not isinstance(raw, dict):
        return {}, [f"{where}: the platform facts are not a map; ignored"]
    facts: dict[str, Any] = {}
    problems: list[str] = []
    for name, value in raw.items():
        ok: bool
        if not isinstance(name, str):
            ok = False
        elif name in PLATFORM_TEXT:
            ok = _text(value)
        elif name == "cores":
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32
        elif name == "libraries":
            ok = isinstance(value, dict) and all(_text(k) and _text(v) for k, v in value.items())
        else:
            try:
                check_settings({name: value})
                ok = True
            except TypeError:
                ok = False
        if ok:
            facts[name] = dict(value) if isinstance(value, dict) else value
        else:
            problems.append(f"{where}: platform fact {_short(name)} is malformed ({_short(value)}); ignored")
    return facts, problems


def is_date(value: Any) -> bool:
    """A Unix time in seconds that a calendar can show (finite, 1970 to 2286)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= LATEST_DATE
    )


def is_name(value: Any) -> bool:
    """A namespace name or a problem key: a non-empty text without NUL."""
    return isinstance(value, str) and 0 < len(value) <= MAX_TEXT and "\0" not in value


def _text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
