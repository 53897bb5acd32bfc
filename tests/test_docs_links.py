"""Every relative link in the README, docs/, bench/README.md, bench/RESULTS.md and the recipes'
READMEs leads to a file that exists, and every `#anchor` into a markdown file to one of its
headings (GitHub's slug rule). Web links are not followed: the test stays offline and fast."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); the text may hold one level of brackets or code.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^()\s]+(?:\([^()]*\))?)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
CODE_SPAN = re.compile(r"(`+).*?\1")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def doc_files() -> list[Path]:
    """The markdown a reader reaches from the README."""
    files = [REPO / "README.md", REPO / "bench" / "README.md", REPO / "bench" / "RESULTS.md"]
    files += sorted((REPO / "docs").glob("*.md"))
    files += sorted((REPO / "src" / "grpokit" / "recipes").glob("*/README.md"))
    return files


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked out (a link inside code
    is an example, not a link)."""
    lines: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(CODE_SPAN.sub("", line))
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text lower-cased, every character that is not
    a letter, digit, underscore, hyphen or space dropped, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = text.replace("`", "")
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)  # emphasis markers, not snake_case
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings; a repeated slug gets -1, -2 ... as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else HEADING.match(line)
        if match is None:
            continue
        slug = github_slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def link_targets(path: Path) -> list[str]:
    """Every link target written in a markdown file, inline or as a reference definition."""
    lines = _prose_lines(path.read_text(encoding="utf-8"))
    # A link's text may wrap onto the next line, so inline links are found in the joined text.
    raw = [m.group(1) for m in INLINE_LINK.finditer("\n".join(lines))]
    raw += [m.group(1) for m in map(REFERENCE_DEF.match, lines) if m]
    return [t[1:-1] if t.startswith("<") else t for t in raw]


def broken_links(path: Path, root: Path) -> list[str]:
    """The relative links of `path` that lead nowhere: a missing file, a file outside `root`, or an
    anchor that names no heading of the markdown file it points into."""
    problems: list[str] = []
    for target in link_targets(path):
        if SCHEME.match(target):  # http(s), mailto: not checked offline
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path.resolve()
        if not dest.is_relative_to(root.resolve()):
            problems.append(f"{target}: outside the repository")
        elif not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading with this anchor in {dest.name}")
    return problems


def test_slugs_follow_githubs_rule() -> None:
    assert github_slug("`grpokit demo --long`: three seeds") == "grpokit-demo---long-three-seeds"
    assert (
        github_slug("GPU check (`gpu_check.sh`): ready, not yet run on a GPU")
        == "gpu-check-gpu_checksh-ready-not-yet-run-on-a-gpu"
    )
    assert github_slug("What `make demo` does") == "what-make-demo-does"
    assert github_slug("1. Group-relative advantage (DeepSeekMath 2024, sec. 4.1.2)") == (
        "1-group-relative-advantage-deepseekmath-2024-sec-412"
    )
    assert github_slug("**Bold** and [a link](x.md)") == "bold-and-a-link"


def test_a_broken_link_is_reported(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Title\n\n## Same\n\n## Same\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n"
        "[ok](other.md) [ok](other.md#title) [ok](other.md#same-1) [ok](#page)\n"
        "[web](https://example.org/missing.md) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n"
        "[gone](missing.md) [bad anchor](other.md#nothing) [self](#nowhere) [up](../x.md)\n"
        "[wrapped\nlink](also-missing.md)\n"
        "[ref]: gone-too.md\n",
        encoding="utf-8",
    )
    assert broken_links(page, tmp_path) == [
        "missing.md: no such file",
        "other.md#nothing: no heading with this anchor in other.md",
        "#nowhere: no heading with this anchor in page.md",
        "../x.md: outside the repository",
        "also-missing.md: no such file",
        "gone-too.md: no such file",
    ]


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path: Path) -> None:
    assert path.exists()
    assert broken_links(path, REPO) == []


def test_the_readme_links_every_docs_page() -> None:
    linked = {
        (REPO / target.partition("#")[0]).resolve()
        for target in link_targets(REPO / "README.md")
        if not SCHEME.match(target)
    }
    pages = [*sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "README.md"]
    assert [str(p.relative_to(REPO)) for p in pages if p.resolve() not in linked] == []
