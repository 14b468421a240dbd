"""Check that every citation of a docs page by heading names a heading that page has.

The code and the docs cite a page by file and heading, never by section number
(docs/architecture.md, "Keeping the house"): ``docs/security.md, "Threat model"``. This tool
reads every git-tracked ``*.py``, ``*.md`` and ``*.toml`` file (``git ls-files``), finds such
citations and checks each against the headings (``#`` to ``######`` lines, outside fenced code
blocks) of the page it names. It understands:

- ``docs/NAME.md, "Heading"``, also with the path in backticks or as a markdown link
  (``[NAME.md](NAME.md), "Heading"``); inside ``docs/`` a bare ``NAME.md`` is ``docs/NAME.md``;
  a path to another tracked markdown file (``slurm_plugin/README.md``) is checked the same way;
- a citation wrapped over lines of a comment (``#``, ``#:``, ``//``, ``>``), a docstring or a
  markdown paragraph, and one split over adjacent Python string literals (``\\"`` escapes);
- lists: ``docs/NAME.md, "A" and "B"``, ``"A", "B" or "C"``.

Headings are compared after dropping markdown backticks and collapsing white space, so
``"The script's side: ElasticRun"`` names ``## The script's side: `ElasticRun```. A numbered
heading is cited in full (``"3b. Accounting (slurmdbd)"``). Records (``benchmarks/results/``)
may be cited but are not searched for citations.

Usage (from the repository root)::

    python tools/check_doc_citations.py   # one line per broken citation and exit 1, else "ok"
"""

from __future__ import annotations

import re
import subprocess
import sys
from bisect import bisect_right
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = (".py", ".md", ".toml")
SKIPPED = ("benchmarks/results/",)  # records: cited, but not read for citations

HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
# what starts a continuation line of a comment or a quote: stripped before lines are joined
CONTINUATION = re.compile(r"^\s*(?:#:|#(?!#)|//|>)?\s*")
# an adjacent Python string literal that continues the previous line's
STRING_START = re.compile(r'^[rRbBuUfF]{0,2}"(?!"")')
QUOTED = r'"([^"\n]{1,200})"'
CITATION = re.compile(
    r"(?<![\w/.-])(?:\[[^\]\n]{1,120}\]\(\s*)?`?"
    r"(?P<path>(?:\.\./)*[\w.-]+(?:/[\w.-]+)*\.md)`?\)?"
    r",\s*(?P<heads>" + QUOTED + r"(?:\s*(?:,|and|or)\s*" + QUOTED + r")*)"
)
ONE_QUOTED = re.compile(QUOTED)
PLACEHOLDER = re.compile(r"/[A-Z]+\.md$")  # docs/FILE.md, "Heading": an example, not a page


def normalize(heading: str) -> str:
    """A heading as compared: no markdown backticks, white space collapsed."""
    return " ".join(heading.replace("`", "").split())


def tracked() -> list[str]:
    """The git-tracked files this tool reads, relative to the repository root."""
    out = subprocess.run(["git", "ls-files", "-z", "--", *(f"*{s}" for s in SUFFIXES)],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted(p for p in out.split("\0") if p.endswith(SUFFIXES))


def headings(text: str) -> set[str]:
    """The headings of a markdown page, normalized; lines in fenced code blocks are not."""
    found: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            found.add(normalize(m.group(2)))
    return found


def joined(path: str, text: str) -> tuple[str, list[int], list[int]]:
    """The file as one line: continuation markers stripped, adjacent string literals merged
    (``.py``), ``\\"`` unescaped. Returns the text, the offset where each original line starts
    in it, and those lines' numbers."""
    python = path.endswith(".py")
    parts: list[str] = []
    starts: list[int] = []
    numbers: list[int] = []
    size = 0
    previous_code = ""
    for number, line in enumerate(text.splitlines(), 1):
        content = CONTINUATION.sub("", line, count=1).rstrip()
        glue = " "
        if (python and previous_code.endswith('"') and not previous_code.endswith('"""')
                and (m := STRING_START.match(line.strip()))):
            parts[-1] = parts[-1][:-1]  # the closing quote of the previous literal
            size -= 1
            content, glue = line.strip()[m.end():], ""
        if python:
            content = content.replace('\\"', '"')
        if parts and parts[-1].endswith("/") and content[:1].isalnum():
            glue = ""  # a path wrapped after its folder: "docs/" + "execution.md"
        if parts:
            parts.append(glue)
            size += len(glue)
        starts.append(size)
        numbers.append(number)
        parts.append(content)
        size += len(content)
        stripped = line.strip()
        previous_code = "" if stripped.startswith("#") else stripped
    return "".join(parts), starts, numbers


def resolve(citing: str, cited: str, pages: set[str]) -> str | None:
    """The tracked markdown file a citation names, or None (not a page of this repository)."""
    here = PurePosixPath(citing).parent
    candidates = [str(PurePosixPath(*_normal_parts(here / cited)))]
    if "/" in cited.lstrip("./"):
        candidates.append(str(PurePosixPath(*_normal_parts(PurePosixPath(cited)))))
    else:
        candidates.append(f"docs/{cited}")  # a page named without its folder
    for candidate in candidates:
        if candidate in pages:
            return candidate
    return None


def _normal_parts(path: PurePosixPath) -> list[str]:
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            if parts:
                parts.pop()
        elif part != ".":
            parts.append(part)
    return parts or ["."]


def check(files: list[str]) -> tuple[int, list[str]]:
    """The number of citations in ``files`` and one line per broken one."""
    pages = {p for p in files if p.endswith(".md")}
    texts = {p: (ROOT / p).read_text(encoding="utf-8", errors="replace") for p in files}
    page_headings: dict[str, set[str]] = {}
    count = 0
    broken: list[str] = []
    for path in files:
        if path.startswith(SKIPPED):
            continue
        text, starts, numbers = joined(path, texts[path])
        for m in CITATION.finditer(text):
            page = resolve(path, m.group("path"), pages)
            line = numbers[bisect_right(starts, m.start("path")) - 1]
            if page is None:
                if m.group("path").startswith("docs/") and not PLACEHOLDER.search(m.group("path")):
                    broken.append(f"{path}:{line}: {m.group('path')} is not a tracked file")
                continue
            if page not in page_headings:
                page_headings[page] = headings(texts[page])
            for heading in ONE_QUOTED.findall(m.group("heads")):
                count += 1
                if normalize(heading) not in page_headings[page]:
                    broken.append(f'{path}:{line}: {page} has no heading "{normalize(heading)}"')
    return count, broken


def main() -> int:
    count, broken = check(tracked())
    for line in broken:
        print(line)
    if broken:
        print(f"{len(broken)} of {count} citations name no heading", file=sys.stderr)
        return 1
    print(f"ok: all {count} citations of a page by heading name an existing heading")
    return 0


if __name__ == "__main__":
    sys.exit(main())
