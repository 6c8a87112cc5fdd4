"""The warnings a command met, shown to people: one short line per kind, with a count.

The library says what it handled as ``RuntimeWarning`` s (:mod:`unimatmul.core.notices`);
printed by Python they are a ``<path>:<line>: RuntimeWarning: ...`` line and the source
line under it, each one of hundreds of characters, in the middle of the progress bar.
:func:`collecting` keeps them while a command runs; :func:`lines` gives what the
command prints after its own output: by default one line per kind (``4 warnings:
measurements were unstable ...``), with ``-v`` each distinct warning in full, with
``--quiet`` nothing.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: Kinds a command meets more than once (one warning per shape), summed up in a few words.
KINDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"measurements of .+ were unstable"),
        "measurements were unstable: records marked low-confidence",
    ),
    (
        re.compile(r"the CPU was busy while tuning"),
        "the CPU was busy while tuning: records marked low-confidence",
    ),
    (re.compile(r"backend .+ failed to list candidates"), "a backend failed to list its candidates"),
    (re.compile(r" failed on .+; using Default$"), "a kernel failed; Default ran instead"),
    (re.compile(r"^using Default for "), "tuning failed; Default ran instead"),
)
#: The longest summary line of a warning of no known kind (its start, then "...").
WIDTH = 110
_PREFIX = re.compile(r"^unimatmul(?:: | (?=cache ))")


@dataclass(frozen=True)
class Said:
    """One warning as the command shows it: its full text and the kind it is counted under."""

    text: str
    kind: str


def said(message: warnings.WarningMessage) -> Said:
    """The text and kind of one caught warning (unimatmul's prefix dropped; others keep
    their category's name)."""
    text = str(message.message).strip()
    ours = _PREFIX.match(text)
    text = text[ours.end() :] if ours else f"{message.category.__name__}: {text}"
    for pattern, kind in KINDS:
        if pattern.search(text):
            return Said(text, kind)
    first = text.splitlines()[0] if text else ""
    return Said(text, first if len(first) <= WIDTH else first[: WIDTH - 3].rstrip() + "...")


@contextmanager
def collecting() -> Iterator[list[warnings.WarningMessage]]:
    """Keep every warning given inside (the filters in force still apply) instead of
    printing it; the list fills as they come."""
    with warnings.catch_warnings(record=True) as caught:
        yield caught


def lines(caught: list[warnings.WarningMessage], *, verbose: bool = False, quiet: bool = False) -> list[str]:
    """What to print on stderr for the warnings ``caught``, in the order first met."""
    if quiet or not caught:
        return []
    found = [said(m) for m in caught]
    if verbose:
        counts: dict[str, int] = {}
        for item in found:
            counts[item.text] = counts.get(item.text, 0) + 1
        return [
            f"unimatmul: warning: {text}" + (f" ({n} times)" if n > 1 else "") for text, n in counts.items()
        ]
    kinds: dict[str, list[Said]] = {}
    for item in found:
        kinds.setdefault(item.kind, []).append(item)
    out = []
    for kind, items in kinds.items():
        head = "warning" if len(items) == 1 else f"{len(items)} warnings"
        more = (
            ""
            if all(i.text == kind for i in items)
            else (" (-v shows it)" if len(items) == 1 else " (-v shows them)")
        )
        out.append(f"unimatmul: {head}: {kind}{more}")
    return out
