"""Pluggable per-route quality checks on a completed request's text. A check
takes the output text and the prompt item and returns pass / fail / skipped
with a one-line detail. Built in: ``python_compile`` (``python -m py_compile``
on the extracted code), ``ruff`` (``ruff check`` on it; *skipped*, never
passed, when ruff is not installed), ``json_schema`` (parse + validate against
the prompt's ``schema``), ``golden`` (difflib similarity to the prompt's
``golden`` answer), ``pytest`` (the prompt's ``tests`` run against the
extracted code in a sandbox: ``trtspec.bench.sandbox``; *skipped* for
prompts without tests and where the sandbox cannot be built). Token-exact
equality with the baseline is not a check here: it needs the paired baseline
row and lives in the summary."""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.bench.routes import PromptItem
from trtspec.errors import BenchError

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"
DEFAULT_GOLDEN_THRESHOLD = 0.6
_CHECK_TIMEOUT_S = 20


@dataclass(frozen=True)
class CheckResult:
    status: str
    detail: str = ""
    extra: dict[str, Any] | None = None  # check-specific fields kept in the request row

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, **(self.extra or {})}


CheckFn = Callable[[str, PromptItem], CheckResult]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(text: str, item: PromptItem) -> str:
    """The code a completion stands for.

    A chat answer stands for its first fenced block (else the whole text). A
    plain-prompt completion continues the prompt's code, so the code is the
    prompt plus the output up to the first fence (instruct models often close
    an imagined block and go on in prose); when ``max_tokens`` cut the output
    mid-line, that partial last line is dropped rather than counted as a
    syntax error the model did not make.
    """
    if item.get("prompt") is not None and not item.get("messages"):
        fence = text.find("```")
        body = text if fence < 0 else text[:fence]
        if fence < 0 and body and not body.endswith("\n"):
            body = body[: body.rfind("\n") + 1]
        return str(item["prompt"]) + body
    m = _FENCE.search(text)
    return m.group(2) if m else text


def extract_json(text: str) -> str:
    m = _FENCE.search(text)
    if m:
        return m.group(2).strip()
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        return text.strip()
    end = max(text.rfind("}"), text.rfind("]"))
    return text[start : end + 1] if end > start else text[start:]


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    # one place for the checks' subprocesses: argv list, no shell, bounded time
    return subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=_CHECK_TIMEOUT_S, check=False
    )


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def check_python_compile(text: str, item: PromptItem) -> CheckResult:
    code = extract_code(text, item)
    fd, tmp = tempfile.mkstemp(suffix=".py", prefix="trtspec-check-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(code)
        proc = _run([sys.executable, "-m", "py_compile", tmp])
    finally:
        Path(tmp).unlink(missing_ok=True)
        Path(tmp + "c").unlink(missing_ok=True)
    if proc.returncode == 0:
        return CheckResult(PASS, "compiles")
    detail = _last_line(proc.stderr or proc.stdout)
    return CheckResult(FAIL, detail.replace(tmp, "<output>").replace(Path(tmp).name, "<output>"))


def find_ruff() -> str | None:
    here = Path(sys.executable).parent / "ruff"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("ruff")


def check_ruff(text: str, item: PromptItem) -> CheckResult:
    ruff = find_ruff()
    if ruff is None:
        return CheckResult(SKIPPED, "skipped: ruff not installed")
    code = extract_code(text, item)
    # --isolated: the project's own ruff config must not judge model output
    proc = _run(
        [
            ruff,
            "check",
            "--isolated",
            "--no-cache",
            "--quiet",
            "--output-format",
            "concise",
            "--stdin-filename",
            "output.py",
            "-",
        ],
        stdin=code,
    )
    if proc.returncode == 0:
        return CheckResult(PASS, "ruff clean")
    if proc.returncode == 1:
        first = next((ln for ln in proc.stdout.splitlines() if ln.strip()), "")
        return CheckResult(FAIL, first[:200])
    return CheckResult(FAIL, "ruff error: " + _last_line(proc.stderr))


def check_json_schema(text: str, item: PromptItem) -> CheckResult:
    import jsonschema

    schema = item.get("schema")
    if schema is None:
        return CheckResult(SKIPPED, "skipped: prompt has no schema")
    try:
        value = json.loads(extract_json(text))
    except json.JSONDecodeError as exc:
        return CheckResult(FAIL, f"not JSON: {exc.msg} at char {exc.pos}")
    validator_cls = jsonschema.validators.validator_for(schema)
    errors = sorted(validator_cls(schema).iter_errors(value), key=lambda e: list(e.path))
    if not errors:
        return CheckResult(PASS, "valid")
    err = errors[0]
    where = "/".join(str(p) for p in err.path) or "<root>"
    return CheckResult(FAIL, f"schema: {where}: {err.message}"[:200])


def golden_similarity(text: str, golden: str) -> float:
    """Similarity of ``text`` to ``golden``: the better of the whole-text ratio
    and the best ratio of any run of words in ``text`` about as long as
    ``golden``. An answer that quotes the golden sentence inside a longer reply
    (what a quote-the-passage route asks for) scores near 1; a paraphrase scores
    what difflib says."""
    text, golden = text.strip(), golden.strip()
    best = difflib.SequenceMatcher(None, text, golden, autojunk=False).ratio()
    words, span = text.split(), len(golden.split())
    if len(words) <= span or span == 0:
        return best
    for width in range(max(1, span - 2), span + 3):
        for start in range(0, len(words) - width + 1):
            window = " ".join(words[start : start + width])
            ratio = difflib.SequenceMatcher(None, window, golden, autojunk=False).ratio()
            best = max(best, ratio)
    return best


def check_golden(text: str, item: PromptItem) -> CheckResult:
    golden = item.get("golden")
    if golden is None:
        return CheckResult(SKIPPED, "skipped: prompt has no golden answer")
    threshold = float(item.get("golden_threshold", DEFAULT_GOLDEN_THRESHOLD))
    ratio = golden_similarity(text, str(golden))
    status = PASS if ratio >= threshold else FAIL
    return CheckResult(status, f"similarity {ratio:.2f} (threshold {threshold:.2f})")


def check_pytest(text: str, item: PromptItem) -> CheckResult:
    """The prompt's ``tests`` against the extracted code; a timeout (wall clock
    or CPU time, trtspec.bench.sandbox's defaults) fails. Where the sandbox
    cannot be built the check did not run: *skipped*, saying why."""
    from trtspec.bench.sandbox import run_pytest

    tests = item.get("tests")
    if not tests:
        return CheckResult(SKIPPED, "skipped: prompt has no tests")
    out = run_pytest(extract_code(text, item), str(tests))
    extra = {
        "outcome": out.status,
        "failed_tests": out.failed_tests,
        "containment": out.containment,
        "tree_limits": out.tree_limits,
    }
    if out.status == "unavailable":  # untrusted code is never run outside the sandbox
        return CheckResult(SKIPPED, f"not run: {out.summary}"[:300], extra)
    if out.status == "pass":
        return CheckResult(PASS, out.summary, extra)
    names = f": {', '.join(out.failed_tests)}" if out.failed_tests else ""
    return CheckResult(FAIL, (f"{out.status}{names} ({out.summary})")[:200], extra)


CHECKS: dict[str, CheckFn] = {
    "python_compile": check_python_compile,
    "ruff": check_ruff,
    "json_schema": check_json_schema,
    "golden": check_golden,
    "pytest": check_pytest,
}


def register_check(name: str, fn: CheckFn) -> None:
    """Add a project-specific check usable in a route's ``checks`` list."""
    CHECKS[name] = fn


def validate_check_names(names: list[str], where: str) -> None:
    for name in names:
        if name not in CHECKS:
            close = difflib.get_close_matches(name, list(CHECKS), n=1)
            raise BenchError(
                f"{where}: unknown quality check {name!r}",
                hint=(f"did you mean {close[0]!r}? " if close else "")
                + "known checks: "
                + ", ".join(sorted(CHECKS)),
            )


def default_checks(items: list[PromptItem]) -> list[str]:
    """Checks implied by a prompt set's content when a route names none."""
    names = []
    if any(it.get("schema") is not None for it in items):
        names.append("json_schema")
    if any(it.get("golden") is not None for it in items):
        names.append("golden")
    if any(it.get("tests") for it in items):
        names.append("pytest")
    return names


class QualityRunner:
    """Runs a route's checks, caching by (check, prompt, output): at
    temperature 0 the baseline and every lossless variant produce the same
    text, so each distinct output is checked once."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, str], CheckResult] = {}
        self._lock = threading.Lock()

    def run(
        self, names: list[str], text: str, item: PromptItem, prompt_index: int
    ) -> dict[str, dict[str, Any]]:
        out = {}
        for name in names:
            key = (name, prompt_index, text)
            with self._lock:
                cached = self._cache.get(key)
            if cached is None:
                try:
                    cached = CHECKS[name](text, item)
                except subprocess.TimeoutExpired:
                    cached = CheckResult(FAIL, f"timed out after {_CHECK_TIMEOUT_S}s")
                with self._lock:
                    self._cache[key] = cached
            out[name] = cached.as_dict()
        return out


def quality_passed(quality: dict[str, dict[str, str]] | None) -> bool | None:
    """A request passes when no check failed and at least one ran; ``None``
    when every check was skipped (or none applies)."""
    if not quality:
        return None
    statuses = [q.get("status") for q in quality.values()]
    if FAIL in statuses:
        return False
    if PASS in statuses:
        return True
    return None
