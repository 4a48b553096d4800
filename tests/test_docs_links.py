"""Every relative link in the docs and the README leads to a file in the repository.

A link (``[text](path)``) is resolved from the page's folder; a path quoted as code that climbs
out of its folder (```../x```) is resolved the same way, since a reader follows it too. Both must
name an existing file or folder inside the repository: not a file on the author's machine.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CLIMBING_CODE_PATH = re.compile(r"`(\.\./[^`\s]+)`")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//|#)", re.IGNORECASE)


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def relative_targets(text: str) -> list[str]:
    """The relative paths a page points at (anchors and queries cut off)."""
    prose = _without_code_blocks(text)
    targets = [t for t in LINK.findall(prose) if not EXTERNAL.match(t)]
    targets += CLIMBING_CODE_PATH.findall(prose)
    return [re.split(r"[#?]", target, maxsplit=1)[0] for target in targets]


def problems(page: Path, text: str) -> list[str]:
    """What is wrong with each relative target of ``text``, read as the page ``page``."""
    found = []
    for target in relative_targets(text):
        resolved = (page.parent / target).resolve()
        if not resolved.is_relative_to(ROOT):
            found.append(f"{target}: outside the repository")
        elif not resolved.exists():
            found.append(f"{target}: no such file")
    return found


def test_there_are_pages_with_links() -> None:
    assert len(PAGES) > 5
    assert sum(len(relative_targets(page.read_text())) for page in PAGES) > 20


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(page: Path) -> None:
    assert problems(page, page.read_text()) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see [metrics](metrics.md#names) and [x](https://kafka.apache.org)", []),
        ("[gone](nowhere.md)", ["nowhere.md: no such file"]),
        ("[up](../../etc/passwd)", ["../../etc/passwd: outside the repository"]),
        # docs/semantics.md once named a file beside the repository, not in it
        (
            "restated in `../shared/reference/kafka-semantics.md`",
            ["../shared/reference/kafka-semantics.md: no such file"],
        ),
        ("```\n[in a code block](nowhere.md)\n```", []),
        ("[anchor only](#top) and [README](../README.md)", []),
    ],
)
def test_the_check_itself(text: str, expected: list[str]) -> None:
    """It catches a missing file, a path out of the repository, and the kind of reference
    docs/semantics.md had; it lets anchors, URLs, code blocks and good links pass."""
    assert problems(ROOT / "docs" / "metrics.md", text) == expected
