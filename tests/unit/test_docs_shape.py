"""The documentation keeps its shape (CONTRIBUTING.md, "How the documentation is
organised"): a README within its budget that links every guide; no lab-notebook
lines (measurement rounds, sessions, project issue numbers) and none of this
repository's commit hashes in the README, the guides or the design pages;
design pages within their size, each naming its owner, and every module they
name present in the tree (read from the real paths, so a moved module fails
here); and no link or mention of a documentation page that does not exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "toolkit" / "trtspec"
README_BUDGET = 200
DESIGN_BUDGET = 300

ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
    "twelfth|thirteenth|fourteenth|fifteenth|sixteenth|\\d+(?:st|nd|rd|th)"
)
DIARY = re.compile(
    rf"\b(?:{ORDINALS})(?:\s+(?:to|and)\s+\w+)?\s+rounds?\b"
    r"|\b(?:this|earlier|previous)\s+rounds?\b"
    r"|\b(?:this|last|earlier|previous|later)\s+(?:sessions?|stops?)\b"
    r"|\bround\s+\d+\b"
    r"|\bissue\s+#?\d+\b",
    re.IGNORECASE,
)
HEX = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{7,40}(?![0-9A-Za-z])")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# This repository's pages (and the ones it used to have); upstream repositories'
# docs/ paths quoted as sources are not ours to check.
DOC_MENTION = re.compile(
    r"(?<![\w/.-])docs/(?:(?:guide|design|reference)/[\w.-]+|perf|internals|deploy)\.md\b"
)
FILE_SUFFIXES = (
    ".json",
    ".jsonl",
    ".yaml",
    ".yml",
    ".txt",
    ".md",
    ".pbtxt",
    ".log",
    ".lock",
    ".bin",
    ".engine",
    ".safetensors",
    ".gguf",
    ".cc",
    ".h",
    ".sh",
)
BACKTICKED = re.compile(r"`([^`\s]+)`")


def reader_pages() -> list[Path]:
    """The pages a reader is told are the present: README, guides, design."""
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs" / "guide").glob("*.md")),
        *sorted((ROOT / "docs" / "design").glob("*.md")),
    ]


def design_pages() -> list[Path]:
    """The contract pages (the folder's README is their index)."""
    return sorted(p for p in (ROOT / "docs" / "design").glob("*.md") if p.name != "README.md")


def all_markdown() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md"]
    pages += sorted((ROOT / "docs").rglob("*.md"))
    pages += sorted((ROOT / "build_specs").rglob("*.md"))
    return [p for p in pages if p.exists()]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# ---------------------------------------------------------------- the checks
# Each takes the text (and where it came from) and returns its problems, so the
# tests below can show a check failing on planted text as well as passing on
# the real pages.


def readme_problems(text: str) -> list[str]:
    problems = []
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    if lines > README_BUDGET:
        problems.append(f"README.md has {lines} lines, over its budget of {README_BUDGET}")
    for guide in sorted((ROOT / "docs" / "guide").glob("*.md")):
        if f"docs/guide/{guide.name}" not in text:
            problems.append(f"README.md does not link docs/guide/{guide.name}")
    return problems


def diary_problems(name: str, text: str) -> list[str]:
    return [
        f"{name}:{n}: lab-notebook line ({m.group(0)!r}): state the present; "
        "measurements go in docs/perf.md and commit bodies"
        for n, line in enumerate(text.splitlines(), 1)
        for m in [DIARY.search(line)]
        if m
    ]


def own_commits() -> list[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: this repository's commits are unknown")
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-list", "--all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


def hash_problems(name: str, text: str, commits: list[str]) -> list[str]:
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        for token in HEX.findall(line):
            if any(c.startswith(token) for c in commits):
                problems.append(f"{name}:{n}: names this repository's commit {token}")
    return problems


def _module_files(parts: list[str]) -> list[Path]:
    """Files a path-like module name can be, relative to the repository, the
    toolkit folder or the package."""
    rel = "/".join(parts)
    return [base / rel for base in (ROOT, ROOT / "toolkit", PACKAGE)]


def _defines(module: Path, name: str) -> bool:
    source = module.read_text(encoding="utf-8")
    return re.search(rf"\b{re.escape(name)}\b", source) is not None


def _packages() -> set[str]:
    return {p.name for p in PACKAGE.rglob("*") if p.is_dir() and (p / "__init__.py").exists()}


def _module_basenames() -> dict[str, list[Path]]:
    """Module stems a page may name without their package (``threads.Workers``):
    not the CLI's, and not a stem that is also a package or a spec section."""
    skip = _packages()
    found: dict[str, list[Path]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__init__.py" or "__pycache__" in path.parts or "cli" in path.parts:
            continue
        if path.stem not in skip:
            found.setdefault(path.stem, []).append(path)
    return found


def _package_roots() -> set[str]:
    names = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    return names | {"trtspec", "tests", "benchmarks", "toolkit"}


def module_problems(name: str, text: str) -> list[str]:
    """Every trtspec module a design page names must exist, and so must the
    name it points into (``threads.ExecStream``, ``trtspec.spec.Spec``)."""
    roots = _package_roots()
    basenames = _module_basenames()
    problems = []
    owner = [line for line in text.splitlines() if line.startswith("**Owner:**")]
    if not owner:
        problems.append(f"{name}: no '**Owner:**' line naming the modules that own it")
    elif not BACKTICKED.findall(owner[0]):
        problems.append(f"{name}: the '**Owner:**' line names no module")
    for n, line in enumerate(text.splitlines(), 1):
        for quoted in BACKTICKED.findall(line):
            token = quoted.rstrip(".,;:")
            if any(c in token for c in "<>{}*$=()[]") or token.startswith(("/", ".")):
                continue
            if token.endswith(FILE_SUFFIXES):
                if "/" in token:
                    problems += _path_problems(f"{name}:{n}: `{token}`", token, roots)
                continue
            where = f"{name}:{n}: `{token}`"
            if token.startswith("trtspec.") and re.fullmatch(r"[\w.]+", token):
                problems += _dotted_problems(where, token.split("."))
            elif "/" in token:
                problems += _path_problems(where, token, roots)
            elif re.fullmatch(r"\w+\.\w+(\.\w+)*", token):
                mod, attr = token.split(".")[:2]
                known = mod in basenames and not token.endswith(".py")
                if known and not any(_defines(p, attr) for p in basenames[mod]):
                    problems.append(f"{where}: no {attr!r} in {mod}.py")
    return problems


def _dotted_problems(where: str, parts: list[str]) -> list[str]:
    base = ROOT / "toolkit"
    module = None
    i = 0
    while i < len(parts):
        candidate = base.joinpath(*parts[: i + 1])
        if (candidate / "__init__.py").exists():
            module = candidate / "__init__.py"
        elif candidate.with_suffix(".py").exists():
            module = candidate.with_suffix(".py")
        else:
            break
        i += 1
    if module is None:
        return [f"{where}: no such module"]
    if i < len(parts) and not _defines(module, parts[i]):
        return [f"{where}: no {parts[i]!r} in {_rel(module)}"]
    return []


def _is_code_folder(path: Path) -> bool:
    """A folder that holds code (a moved package leaves ``__pycache__`` behind)."""
    return path.is_dir() and any(path.glob("*.py"))


def _path_problems(where: str, token: str, roots: set[str]) -> list[str]:
    parts = token.rstrip("/").split("/")
    if parts[0] not in roots:
        return []  # an upstream path (tensorrt_llm/..., src/...) or a runtime folder
    last = parts[-1]
    attr = None
    if not last.endswith(".py") and "." in last and not re.search(r"\.\w{2,4}$", last):
        stem, attr = last.split(".", 1)
        parts[-1] = stem + ".py"
    elif last.endswith(FILE_SUFFIXES) and parts[0] not in ("tests", "benchmarks", "trtspec"):
        return []  # a file a runtime writes beside the code (router/rollout/state.json)
    files = [f for f in _module_files(parts) if f.is_file() or _is_code_folder(f)]
    if not files:
        return [f"{where}: no such file or folder in the repository"]
    if attr and not any(_defines(f, attr.split(".")[0]) for f in files if f.is_file()):
        return [f"{where}: no {attr.split('.')[0]!r} in {_rel(files[0])}"]
    return []


def link_problems(page: Path, text: str) -> list[str]:
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            problems.append(f"{_rel(page)}: link to a missing page: {target}")
    return problems


def mention_problems(name: str, text: str) -> list[str]:
    return [
        f"{name}: names a missing page {m}"
        for m in sorted(set(DOC_MENTION.findall(text)))
        if not (ROOT / m).exists()
    ]


# ---------------------------------------------------------------- the tests


def test_readme_within_budget_and_links_every_guide() -> None:
    problems = readme_problems((ROOT / "README.md").read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


def test_no_lab_notebook_lines_in_readme_guides_and_design() -> None:
    problems = []
    for page in reader_pages():
        problems += diary_problems(_rel(page), page.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


def test_no_commit_hash_of_this_repository_in_readme_guides_and_design() -> None:
    commits = own_commits()
    problems = []
    for page in reader_pages():
        problems += hash_problems(_rel(page), page.read_text(encoding="utf-8"), commits)
    assert not problems, "\n".join(problems)


def test_design_pages_are_short_and_name_modules_that_exist() -> None:
    pages = design_pages()
    assert pages, "docs/design/ holds no page"
    problems = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        lines = text.count("\n")
        if lines > DESIGN_BUDGET:
            problems.append(f"{_rel(page)}: {lines} lines, over {DESIGN_BUDGET}")
        problems += module_problems(_rel(page), text)
    assert not problems, "\n".join(problems)


def test_every_link_in_the_docs_resolves() -> None:
    problems = []
    for page in all_markdown():
        problems += link_problems(page, page.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


def test_every_docs_page_named_in_code_and_docs_exists() -> None:
    problems = []
    sources = [*all_markdown(), ROOT / "Makefile", ROOT / "Dockerfile", ROOT / "Dockerfile.llmapi"]
    for folder in ("toolkit", "tests", "benchmarks", "build_specs", ".ci"):
        sources += [
            p
            for p in (ROOT / folder).rglob("*")
            if p.is_file()
            and p.suffix in {".py", ".yaml", ".yml", ".md", ".txt", ""}
            and "__pycache__" not in p.parts
            and ".egg-info" not in str(p)
        ]
    for path in sources:
        if path.exists() and path.name != "CHANGELOG.md":  # history names old pages
            problems += mention_problems(
                _rel(path), path.read_text(encoding="utf-8", errors="replace")
            )
    assert not problems, "\n".join(problems)


# ------------------------------------------------- the checks can fail at all


def test_the_checks_catch_planted_faults(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    bloated = readme + "filler\n" * (README_BUDGET + 1 - readme.count("\n"))
    assert any("over its budget" in p for p in readme_problems(bloated))
    assert diary_problems("x.md", "In the fifth round the router got faster.\n")
    assert diary_problems("x.md", "Measured this session on a slow VM.\n")
    assert diary_problems("x.md", "as issue 24 item 3 asked\n")
    assert not diary_problems("x.md", "each round drafts k tokens; the next round re-sends\n")
    commits = own_commits()
    assert hash_problems("x.md", f"fixed in {commits[0][:8]}\n", commits)
    assert not hash_problems("x.md", "TRT-LLM `builder.py` @14e801da\n", ["0" * 40])
    page = "# p\n\n**Owner:** `trtspec/no_such_module.py`\n\nuses `threads.NoSuchThing`\n"
    found = module_problems("p.md", page)
    assert any("no_such_module" in p for p in found)
    assert any("NoSuchThing" in p for p in found)
    assert module_problems("p.md", "# p\n\nno owner line\n")
    assert any("'nope'" in p for p in module_problems("p.md", "**Owner:** `trtspec.nope`"))
    assert any(
        "no such file" in p for p in module_problems("p.md", "**Owner:** `trtspec/runtime/x.py`")
    )
    md = tmp_path / "page.md"
    assert link_problems(md, "see [gone](missing.md) and [web](https://127.0.0.1/page)\n")
    gone = "docs/" + "internals.md"  # split, so this file does not name it
    assert mention_problems("x.py", f"# see {gone} §9\n")
