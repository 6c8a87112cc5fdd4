"""Every path the README, docs/ and the results' READMEs point at exists in the tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# A Markdown link's target: [text](target), without a scheme (http:, mailto:) or a bare #anchor.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A path in backticks that names a file or folder of the tree from its root.
ROOTED = re.compile(r"`((?:benchmarks|scripts|conformance/reports)/[^`\s*?<>{}]+|docs/[^`\s/*?<>{}]+\.md)`")
# A path in backticks relative to the file itself (../other-benchmark/, ./file).
RELATIVE = re.compile(r"`(\.\.?/[^`\s*?<>{}]+)`")


def _documents() -> list[Path]:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    docs += sorted((REPO / "benchmarks" / "results").glob("**/README.md"))
    return [p for p in docs if p.exists()]


def _targets(path: Path) -> list[tuple[str, Path]]:
    text = path.read_text(encoding="utf-8")
    found: list[tuple[str, Path]] = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        found.append((target, path.parent / target.split("#")[0]))
    found += [(t, REPO / t) for t in ROOTED.findall(text)]
    found += [(t, path.parent / t) for t in RELATIVE.findall(text)]
    return found


@pytest.mark.parametrize("path", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    missing = [text for text, target in _targets(path) if not target.exists()]
    assert missing == [], f"{path.relative_to(REPO)} points at paths that do not exist: {missing}"


def test_no_link_leaves_the_repository() -> None:
    outside = [
        f"{path.relative_to(REPO)}: {text}"
        for path in _documents()
        for text, target in _targets(path)
        if not target.resolve().is_relative_to(REPO)
    ]
    assert outside == [], f"links outside a clone of the repository: {outside}"
