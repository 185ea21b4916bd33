"""The sandbox the pytest check runs generated code in, built in pure Python
(ctypes: unshare, mount, pivot_root, capset) by the launcher process
``python -m trtspec.bench.sandbox`` before it execs pytest. Layers, each of
which must succeed or nothing runs (the launcher prints ``MARK_REFUSED`` and
why, and exits):

1. the launcher joins the check's cgroups (pids, memory) when the parent made
   them; they bound the whole process tree;
2. new user, mount, PID, network, IPC, UTS and cgroup namespaces. The code
   runs as uid/gid ``SANDBOX_UID`` inside, which is host uid/gid 65534
   (nobody) when the bench runs as root (a helper still outside writes the
   mapping) or the bench's own uid otherwise; host root is never mapped, no
   supplementary groups are kept and ``setgroups`` is denied;
3. a new root (pivot_root; the host's tree is detached, not just hidden): a
   read-only tmpfs holding read-only binds of ``/usr`` (and ``/bin``, ``/lib*``
   where they are not links into it), the Python installation and the folders
   pytest is imported from; a minimal ``/etc`` (``passwd``, ``group``, ``hosts``
   written here, ``ld.so.cache``); a ``/dev`` with only ``null``, ``zero``,
   ``random``, ``urandom`` (binds of the host's nodes), an empty ``/dev/shm``
   tmpfs; ``/proc`` of the new PID namespace, read-only; no ``/sys``, ``/run``
   or host ``/tmp``; the writable ``WORK_DIR`` a tmpfs capped at
   ``WORK_DIR_LIMIT_BYTES`` (``/tmp`` links into it) holding copies of the
   code and tests;
4. no further user namespace may be made inside (its limit set to 0); every
   capability dropped (bounding set emptied, then none effective,
   permitted or inheritable), ``no_new_privs``; then rlimits: CPU seconds,
   address space, file size, open files, no core dumps, and processes
   (RLIMIT_NPROC counts per user namespace, so it is this check's tree). With
   no cgroups the tree's processes and address space are the rlimits'
   product, made smaller (``FALLBACK_*``);
5. the parent-death signal, so the sandbox ends with its launcher.

The network namespace has no interface up (not even loopback), so there is
no IP network and no abstract unix socket of the host; path sockets of the
host are out of reach because its file tree is. No syscall filter (seccomp):
the kernel's whole syscall surface for an unprivileged user stays
reachable."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import signal
import sys
from pathlib import Path

CODE_MODULE = "solution"
TEST_FILE = "test_solution.py"
WORK_DIR = "/sandbox"
SANDBOX_UID = 1000  # inside; the host sees HOST_UID (root runs) or its own uid
SANDBOX_USER = "sandbox"
HOST_UID = 65534  # nobody
ADDRESS_SPACE_LIMIT_BYTES = 2**30  # per process
TREE_MEMORY_LIMIT_BYTES = 768 * 2**20  # the whole tree, cgroup
PROCESS_LIMIT = 64  # the whole tree: pids cgroup and RLIMIT_NPROC
FALLBACK_ADDRESS_SPACE_LIMIT_BYTES = 256 * 2**20  # without cgroups: 16 × 256 MiB
FALLBACK_PROCESS_LIMIT = 16
WORK_DIR_LIMIT_BYTES = 64 * 2**20
FILE_SIZE_LIMIT_BYTES = 16 * 2**20
OPEN_FILES_LIMIT = 256
MARK_CONTAINED = "trtspec-sandbox: contained"
MARK_REFUSED = "trtspec-sandbox: refused:"
DEVICES = ("null", "zero", "random", "urandom")
_FILES = ("/etc/ld.so.cache", *(f"/dev/{name}" for name in DEVICES))  # bound one by one

# linux/sched.h, linux/mount.h, linux/prctl.h, linux/capability.h
_CLONE_NEWNS, _CLONE_NEWCGROUP, _CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
_CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
_NAMESPACES = (
    _CLONE_NEWUSER
    | _CLONE_NEWNS
    | _CLONE_NEWPID
    | _CLONE_NEWNET
    | _CLONE_NEWIPC
    | _CLONE_NEWUTS
    | _CLONE_NEWCGROUP
)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_NOATIME, _MS_NODIRATIME, _MS_BIND = 32, 1024, 2048, 4096
_MS_REC, _MS_PRIVATE, _MS_RELATIME = 16384, 1 << 18, 1 << 21
_MNT_DETACH = 2
# statvfs f_flag bit -> mount flag: a remount of a bind inherited from a more
# privileged namespace must repeat the flags it has (they are locked)
_ST_TO_MS = (
    (1, _MS_RDONLY),
    (2, _MS_NOSUID),
    (4, _MS_NODEV),
    (8, _MS_NOEXEC),
    (1024, _MS_NOATIME),
    (2048, _MS_NODIRATIME),
    (4096, _MS_RELATIME),
)
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 1, 24, 38
_CAPABILITY_VERSION_3 = 0x20080522
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}


class Refused(Exception):
    """A layer could not be built; the message says which and why."""

    def __init__(self, message: str, errno_: int = 0) -> None:
        super().__init__(message)
        self.errno = errno_


def child_env(home: Path) -> dict[str, str]:
    """The sandboxed process's whole environment: nothing inherited."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "USER": SANDBOX_USER,
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
    }


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise Refused(f"{what}: {os.strerror(err)}", err)


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str = "") -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    rc = _libc().mount(enc(src), dst.encode(), enc(fstype), flags, enc(data or None))
    _check(rc, f"mount {src or fstype or ''} on {dst}".replace("  ", " "))


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# -- 2. namespaces and the user mapping ---------------------------------------------------


def enter_namespaces() -> dict[str, int]:
    """Unshare every namespace and become ``SANDBOX_UID`` in the new user
    namespace (still with the namespace's capabilities, dropped later).
    Returns ``open_sources()``, opened in between."""
    if not sys.platform.startswith("linux"):
        raise Refused("needs Linux namespaces")
    libc = _libc()
    if os.geteuid() != 0:
        _check(libc.unshare(_NAMESPACES), "unshare the namespaces")
        sources = open_sources()
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{SANDBOX_UID} {os.geteuid()} 1\n")
        _write("/proc/self/gid_map", f"{SANDBOX_UID} {os.getegid()} 1\n")
    else:
        # only a process outside the new user namespace may map another uid
        try:
            os.setgroups([])  # else the host's groups (root's) would stay with the code
        except OSError as exc:
            raise Refused(f"drop supplementary groups: {exc.strerror}") from exc
        go_r, go_w = os.pipe()
        helper = os.fork()
        if helper == 0:  # pragma: no cover - the helper
            code = 1
            try:
                os.close(go_w)
                if os.read(go_r, 1) == b"1":
                    pid = os.getppid()
                    _write(f"/proc/{pid}/uid_map", f"{SANDBOX_UID} {HOST_UID} 1\n")
                    _write(f"/proc/{pid}/setgroups", "deny")
                    _write(f"/proc/{pid}/gid_map", f"{SANDBOX_UID} {HOST_UID} 1\n")
                    code = 0
            except OSError as exc:
                code = 2 + (exc.errno or 0) % 200
            finally:
                os._exit(code)
        os.close(go_r)
        ok = libc.unshare(_NAMESPACES) == 0
        err = ctypes.get_errno()
        try:
            sources = open_sources() if ok else {}
        finally:
            os.write(go_w, b"1" if ok else b"0")
        os.close(go_w)
        _, status = os.waitpid(helper, 0)
        if not ok:
            raise Refused(f"unshare the namespaces: {os.strerror(err)}")
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            why = os.strerror(code - 2) if code >= 2 else "helper failed"
            raise Refused(f"map uid {SANDBOX_UID} to host uid {HOST_UID}: {why}")
    try:
        os.setresgid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID)
        os.setresuid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID)
    except OSError as exc:
        raise Refused(f"become uid {SANDBOX_UID}: {exc.strerror}") from exc
    return sources


# -- 3. the new root ----------------------------------------------------------------------


def _remount_read_only(point: str) -> None:
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
    st = os.statvfs(point).f_flag
    flags |= sum(ms for bit, ms in _ST_TO_MS if st & bit)
    _mount(None, point, None, flags)


def _mount_points_under(top: str) -> list[str]:
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            raw = line.split()[4]
            point = raw.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            if point == top or point.startswith(top.rstrip("/") + "/"):
                points.append(point.replace("\\134", "\\"))
    return points


def open_sources() -> dict[str, int]:
    """O_PATH descriptors of every host path the sandbox binds, opened in the
    new mount namespace (a bind's source must be in it) while still the host
    uid: once mapped to an unprivileged uid the launcher could not walk into,
    say, ``/root/.pyenv``. Bind mounts take them as ``/proc/self/fd/N``."""
    paths = [*read_only_dirs(), *_FILES]
    flags = os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW
    return {p: os.open(p, flags) for p in paths if os.path.exists(p) and not os.path.islink(p)}


def _bind_read_only(src: str, dst: str, sources: dict[str, int]) -> None:
    _bind(src, dst, sources)
    for point in _mount_points_under(dst):
        _remount_read_only(point)


def _bind(src: str, dst: str, sources: dict[str, int], flags: int = _MS_BIND | _MS_REC) -> None:
    if os.path.isdir(f"/proc/self/fd/{sources[src]}"):
        os.makedirs(dst, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
        Path(dst).touch(0o444)
    rc = _libc().mount(f"/proc/self/fd/{sources[src]}".encode(), dst.encode(), None, flags, None)
    _check(rc, f"bind {src} on {dst}")


def read_only_dirs() -> list[str]:
    """Host folders the sandbox sees (read-only): the system's programs and
    libraries, and this Python with pytest. Nested ones are dropped."""
    wanted = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        wanted += [os.path.abspath(prefix), os.path.realpath(prefix)]
    import importlib.util

    for name in ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "exceptiongroup"):
        spec = importlib.util.find_spec(name)
        if spec and spec.origin:  # the folder pytest imports it from (site-packages)
            origin = Path(spec.origin)
            wanted.append(str(origin.parent.parent if origin.name == "__init__.py" else origin))
    real = [p for p in dict.fromkeys(wanted) if os.path.isdir(p) and not os.path.islink(p)]
    real = [p for p in real if p != "/"]
    return [p for p in real if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in real)]


def build_root(new_root: str, files: dict[str, bytes], sources: dict[str, int]) -> None:
    """Mount the sandbox's file tree on ``new_root`` and pivot into it."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    _mount("tmpfs", new_root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=4m,nr_inodes=4096,mode=0755")
    for path in sources:
        if path not in _FILES:
            _bind_read_only(path, new_root + path, sources)
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink("/" + name):
            os.symlink(os.readlink("/" + name), f"{new_root}/{name}")
    _build_etc(new_root, sources)
    _build_dev(new_root, sources)
    # no user namespace inside this one (bubblewrap's --disable-userns): each
    # would give the code a root of its own to reach more of the kernel with.
    # The limit belongs to our user namespace, written through the host's /proc
    # while it is still in view.
    try:
        _write("/proc/sys/user/max_user_namespaces", "0")
    except OSError as exc:
        raise Refused(f"forbid nested user namespaces: {exc.strerror}") from exc
    os.mkdir(f"{new_root}/proc", 0o555)
    try:  # a /proc of the new PID namespace (while the host's is still in view: the
        # kernel allows a new one only where one is fully visible), or none at all
        flags = _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        _mount("proc", f"{new_root}/proc", "proc", flags)
    except Refused as exc:
        if exc.errno not in (errno.EPERM, errno.EACCES):
            raise  # a container that masks parts of /proc forbids a fresh one: go without
    work = new_root + WORK_DIR
    os.mkdir(work, 0o700)
    _mount("tmpfs", work, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={WORK_DIR_LIMIT_BYTES},mode=0700")
    os.mkdir(f"{work}/tmp", 0o700)
    for name, data in files.items():
        Path(work, name).write_bytes(data)
    # /tmp for code that names it; TMPDIR points into the work folder anyway.
    # A bound Python install under /tmp (a checkout's .venv there) already made
    # the folder: then the install stays visible there, read-only, and /tmp is
    # not writable.
    if not os.path.lexists(f"{new_root}/tmp"):
        os.symlink(WORK_DIR.lstrip("/") + "/tmp", f"{new_root}/tmp")
    # pivot_root(".", "."): the old root ends up stacked over the new one; detach it
    os.chdir(new_root)
    number = _SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise Refused(f"pivot_root: unknown syscall number on {platform.machine()}")
    _check(_libc().syscall(number, b".", b"."), "pivot_root")
    _check(_libc().umount2(b".", _MNT_DETACH), "detach the host's root")
    os.chdir("/")
    _mount(None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    _check(_libc().sethostname(b"sandbox", 7), "set the host name")
    os.chdir(WORK_DIR)


def _build_etc(new_root: str, sources: dict[str, int]) -> None:
    etc = f"{new_root}/etc"
    os.mkdir(etc, 0o755)
    home = WORK_DIR
    Path(etc, "passwd").write_text(
        f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}::{home}:/bin/sh\n"
        "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n"
    )
    Path(etc, "group").write_text(f"{SANDBOX_USER}:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
    Path(etc, "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
    if "/etc/ld.so.cache" in sources:  # where the dynamic linker finds libraries
        _bind_read_only("/etc/ld.so.cache", f"{etc}/ld.so.cache", sources)


def _build_dev(new_root: str, sources: dict[str, int]) -> None:
    dev = f"{new_root}/dev"
    os.mkdir(dev, 0o755)
    _mount("tmpfs", dev, "tmpfs", _MS_NOSUID | _MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755")
    for name in DEVICES:
        _bind(f"/dev/{name}", f"{dev}/{name}", sources, _MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm", 0o700)
    _mount(
        "tmpfs", f"{dev}/shm", "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "size=16m,mode=0700"
    )
    _mount(None, dev, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC)


# -- 4. privileges and limits ---------------------------------------------------------------


def drop_privileges() -> None:
    libc = _libc()
    for cap in range(64):
        rc = libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
        if rc != 0 and ctypes.get_errno() != errno.EINVAL:  # EINVAL: past the last cap
            raise Refused(f"drop capability {cap}: {os.strerror(ctypes.get_errno())}")
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable × 2 words: all zero
    _check(libc.capset(header, data), "drop every capability")
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")


def apply_limits(cpu_s: int, *, tree_in_cgroup: bool) -> None:
    processes = PROCESS_LIMIT if tree_in_cgroup else FALLBACK_PROCESS_LIMIT
    space = ADDRESS_SPACE_LIMIT_BYTES if tree_in_cgroup else FALLBACK_ADDRESS_SPACE_LIMIT_BYTES
    # CPU: SIGXCPU at the soft limit, SIGKILL a second later should it be caught
    for which, want_soft, want_hard in (
        (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),
        (resource.RLIMIT_AS, space, space),
        (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT_BYTES, FILE_SIZE_LIMIT_BYTES),
        (resource.RLIMIT_NOFILE, OPEN_FILES_LIMIT, OPEN_FILES_LIMIT),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_NPROC, processes, processes),
    ):
        _, old_hard = resource.getrlimit(which)
        cap = want_hard if old_hard == resource.RLIM_INFINITY else min(want_hard, old_hard)
        resource.setrlimit(which, (min(want_soft, cap), cap))


def exec_pytest(cpu_s: int, basetemp: str, *, tree_in_cgroup: bool) -> None:
    apply_limits(cpu_s, tree_in_cgroup=tree_in_cgroup)
    argv = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider"]
    argv += ["-c", f"{WORK_DIR}/pytest.ini", f"--basetemp={WORK_DIR}/tmp/{basetemp}", TEST_FILE]
    print(MARK_CONTAINED, flush=True)
    _check(_libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "set the parent-death signal")
    os.execve(sys.executable, argv, child_env(Path(WORK_DIR)))


# -- the launcher ---------------------------------------------------------------------------


def main(argv: list[str]) -> None:  # pragma: no cover - runs in the launcher process
    folder, cpu_s, cgroups = argv[0], int(argv[1]), argv[2:]
    try:
        for path in cgroups:
            _write(os.path.join(path, "cgroup.procs"), str(os.getpid()))
        files = {n: Path(folder, n).read_bytes() for n in (f"{CODE_MODULE}.py", TEST_FILE)}
        files["pytest.ini"] = b"[pytest]\n"  # pins the rootdir; keeps any outer config out
        sources = enter_namespaces()
    except (Refused, OSError) as exc:
        print(f"{MARK_REFUSED} {exc}", flush=True)
        os._exit(125)
    # the new PID namespace holds our children, not us: fork its first process
    pid = os.fork()
    if pid == 0:
        try:
            build_root(folder, files, sources)
            drop_privileges()
            exec_pytest(cpu_s, os.path.basename(folder), tree_in_cgroup=bool(cgroups))
        except BaseException as exc:  # whatever failed, nothing runs
            print(f"{MARK_REFUSED} {exc}", flush=True)
        finally:
            os._exit(125)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # report the signal (SIGKILL at the hard CPU limit) as our own
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)
