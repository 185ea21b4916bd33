"""Finding a runnable tritonserver and preparing what it needs.

Owns the discovery order (explicit path › ``PATH`` › ``/opt/tritonserver/bin``
› the binary bundled in the ``nvidia-pytriton`` wheel) and, for the wheel's
CPU build, the assembled ``--backend-directory`` (the Python backend library
and the stub for the running Python, built atomically in a cache folder) and
the environment (``LD_LIBRARY_PATH`` with this interpreter's libpython first,
``PYTHONPATH`` with this venv and the folder holding ``trtspec``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import site
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import trtspec
from trtspec.errors import ServerError

OPT_BIN = Path("/opt/tritonserver/bin")
_STUB_NAME = "triton_python_backend_stub"
_UTILS_NAME = "triton_python_backend_utils.py"
_PATH_HOOK = "_trtspec_stub_path"
# The wheel's stub embeds Python in isolated mode, so it ignores PYTHONPATH. Our
# copy of triton_python_backend_utils (in the backend folder, on the stub's path)
# applies PYTHONPATH, .pth files included (an editable install's lives there),
# ahead of the base interpreter's site-packages when a model.py imports it; a
# model.py that needs the venv therefore imports it first. The stub imports
# model.py before that module, so this cannot happen earlier.
_PATH_HOOK_SOURCE = """\
\"\"\"Written by trtspec: apply PYTHONPATH, which the isolated stub ignores.\"\"\"
import os
import site
import sys

_entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
for _entry in reversed(_entries):
    if _entry in sys.path:
        sys.path.remove(_entry)
    sys.path.insert(0, _entry)
for _entry in _entries:
    site.addsitedir(_entry)
"""


@dataclass(frozen=True)
class TritonInstall:
    """A runnable tritonserver: the binary, the ``--backend-directory`` to pass
    (``None``: the binary's built-in default) and the environment variables it
    needs on top of ``os.environ``. ``source`` says where it was found."""

    binary: Path
    backend_dir: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    source: str = "explicit"


def cache_root() -> Path:
    """Where trtspec keeps machine-local derived files (``TRTSPEC_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/trtspec``, else ``~/.cache/trtspec``)."""
    explicit = os.environ.get("TRTSPEC_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "trtspec"


def pytriton_server_dir() -> Path | None:
    """The ``pytriton/tritonserver`` folder of the installed nvidia-pytriton
    wheel, found without importing pytriton (its import is slow)."""
    try:
        spec = importlib.util.find_spec("pytriton")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "tritonserver"
        if (candidate / "bin" / "tritonserver").is_file():
            return candidate
    return None


def _wheel_root_of(binary: Path) -> Path | None:
    """The wheel's ``tritonserver`` folder when ``binary`` is the wheel's bundled
    server (recognised by its layout, so an explicit path to it works too)."""
    root = binary.resolve().parent.parent
    if (root / "python_backend_stubs").is_dir() and (
        root / "backends" / "python" / "libtriton_python.so"
    ).is_file():
        return root
    return None


def find_tritonserver(
    explicit: str | os.PathLike[str] | None = None,
    *,
    search_path: str | None = None,
    opt_dir: Path = OPT_BIN,
    wheel_dir: Path | bool | None = True,
    cache_dir: Path | None = None,
) -> TritonInstall:
    """Locate tritonserver: ``explicit`` › ``PATH`` › ``opt_dir`` › the
    nvidia-pytriton wheel. ``search_path`` replaces ``$PATH`` and ``wheel_dir``
    the wheel's folder (``True``: look it up, ``None``/``False``: skip); both
    exist for tests. Raises ``ServerError`` naming what was tried."""
    if explicit is not None:
        binary = Path(explicit).expanduser()
        if not binary.is_file():
            raise ServerError(
                f"tritonserver binary not found: {binary}",
                hint="pass the path of an executable tritonserver, or leave it out to "
                "search PATH, /opt/tritonserver/bin and the nvidia-pytriton wheel",
            )
        if not os.access(binary, os.X_OK):
            raise ServerError(
                f"tritonserver binary is not executable: {binary}",
                hint=f"chmod +x {binary}",
            )
        return _install_for(binary.absolute(), "explicit", cache_dir)
    on_path = shutil.which("tritonserver", path=search_path)
    if on_path:
        return _install_for(Path(on_path).absolute(), "PATH", cache_dir)
    opt_binary = opt_dir / "tritonserver"
    if opt_binary.is_file() and os.access(opt_binary, os.X_OK):
        return _install_for(opt_binary, str(opt_dir), cache_dir)
    root = pytriton_server_dir() if wheel_dir is True else (wheel_dir or None)
    if root is not None and (root / "bin" / "tritonserver").is_file():
        return _install_for(root / "bin" / "tritonserver", "nvidia-pytriton", cache_dir)
    raise ServerError(
        f"tritonserver not found on PATH, in {opt_dir} or in the nvidia-pytriton wheel",
        hint="run inside the Triton TRT-LLM container, `pip install nvidia-pytriton` "
        "(bundles a CPU-capable tritonserver), or pass the binary with --tritonserver",
    )


def _install_for(binary: Path, source: str, cache_dir: Path | None) -> TritonInstall:
    root = _wheel_root_of(binary)
    if root is None:
        env = {}
        package_parent = _trtspec_import_dir()
        # The stub of a foreign install runs its own Python; give it trtspec only
        # when trtspec is not sitting inside this interpreter's site-packages,
        # whose compiled packages would not match that Python.
        if package_parent.name not in ("site-packages", "dist-packages"):
            env["PYTHONPATH"] = _join_paths([str(package_parent)], "PYTHONPATH")
        return TritonInstall(binary=binary, backend_dir=None, env=env, source=source)
    backend_dir = prepare_backend_dir(root, cache_dir or cache_root())
    return TritonInstall(binary=binary, backend_dir=backend_dir, env=wheel_env(root), source=source)


def _trtspec_import_dir() -> Path:
    return Path(trtspec.__file__).resolve().parent.parent


def _join_paths(first: Iterable[str], variable: str) -> str:
    """``first`` (deduplicated, order kept) followed by the current value of
    ``variable``, so a user's own setting still applies after ours."""
    parts: list[str] = []
    for entry in [*first, *os.environ.get(variable, "").split(os.pathsep)]:
        if entry and entry not in parts:
            parts.append(entry)
    return os.pathsep.join(parts)


def _libpython_dir() -> Path:
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not libdir or not soname or not (Path(libdir) / soname).is_file():
        raise ServerError(
            f"Python {version} at {sys.executable} has no shared libpython "
            f"({soname or 'libpython'} not in {libdir}); the Python backend stub links against it",
            hint="use a Python built with --enable-shared (distribution or python.org builds; "
            "pyenv with PYTHON_CONFIGURE_OPTS=--enable-shared)",
        )
    return Path(libdir)


def wheel_env(root: Path) -> dict[str, str]:
    """Environment for the wheel's tritonserver and its stubs. The running
    interpreter's libpython comes first because the stub links ``libpythonX.Y``
    and a system copy of another patch release may otherwise win; the wheel's
    vendored libraries come next. ``PYTHONPATH`` carries this venv's
    site-packages and the folder holding ``trtspec`` because an editable
    install's ``.pth`` file is not read for ``PYTHONPATH`` entries."""
    site_dirs = [str(root.parent.parent)]
    site_dirs += [d for d in site.getsitepackages() if Path(d).is_dir()]
    return {
        "LD_LIBRARY_PATH": _join_paths(
            [str(_libpython_dir()), str(root.parent.parent / "nvidia_pytriton.libs")],
            "LD_LIBRARY_PATH",
        ),
        "PYTHONPATH": _join_paths([str(_trtspec_import_dir()), *site_dirs], "PYTHONPATH"),
    }


def prepare_backend_dir(root: Path, cache: Path) -> Path:
    """Assemble ``<cache>/triton-backends/pyX.Y-<digest>/python/`` from the
    wheel (the backend library and the stub built for the running Python) and
    return the folder to pass as ``--backend-directory``. Built in a temp dir
    and renamed into place, so concurrent callers and interrupted runs never
    see a half-copied folder; the digest changes when the wheel does."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / _STUB_NAME
    if not stub.is_file():
        stubs_dir = root / "python_backend_stubs"
        have = sorted(p.name for p in stubs_dir.iterdir() if (p / _STUB_NAME).is_file())
        raise ServerError(
            f"the nvidia-pytriton wheel at {root} has no Python backend stub for Python "
            f"{version} (it has: {', '.join(have) or 'none'})",
            hint="run trtspec from a Python version the wheel supports, or use another "
            "tritonserver with --tritonserver",
        )
    library = root / "backends" / "python" / "libtriton_python.so"
    utils = root / "backends" / "python" / _UTILS_NAME
    digest = hashlib.sha256(_PATH_HOOK_SOURCE.encode())
    for source in (library, utils, stub):
        stat = source.stat()
        digest.update(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    final = cache / "triton-backends" / f"py{version}-{digest.hexdigest()[:16]}"
    if (final / "python" / _STUB_NAME).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
    try:
        target = staging / "python"
        target.mkdir()
        shutil.copy2(library, target / library.name)
        shutil.copy2(stub, target / stub.name)
        (target / f"{_PATH_HOOK}.py").write_text(_PATH_HOOK_SOURCE, encoding="utf-8")
        (target / _UTILS_NAME).write_text(
            f"import {_PATH_HOOK}  # noqa: F401  (added by trtspec, see that module)\n"
            + utils.read_text(encoding="utf-8"),
            encoding="utf-8",
        )
        try:
            os.rename(staging, final)
        except OSError:
            # Another process renamed its copy first; theirs is complete, use it.
            if not (final / "python" / _STUB_NAME).is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return final
