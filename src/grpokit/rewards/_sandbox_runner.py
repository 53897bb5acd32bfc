"""Child side of :mod:`grpokit.rewards.sandbox`: confine this process, then run untrusted code.

Run as ``python -I -S -X utf8 _sandbox_runner.py CONFIG_JSON``; it imports only the standard
library. Steps, in this order: read the success nonce from its pipe; restrict file-system writes
to the working directory (and TCP, and signals where the kernel allows) with Landlock; forbid
creating processes or threads, ``execve``, sockets and signalling other processes with a seccomp
filter; set resource limits; install an audit hook (clear Python errors, and the only write guard
where Landlock is missing); execute the program; on success write the nonce to the marker pipe.
The parent treats a run without the nonce as failed, so exiting early (``sys.exit(0)``,
``os._exit(0)``) before the tests ran does not pass them.
"""

from __future__ import annotations

import json
import os
import sys


def _landlock(work_dir: str) -> int:
    """Allow writes only beneath ``work_dir``; return the Landlock ABI used (0 = unavailable)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    create_ruleset, add_rule, restrict_self = 444, 445, 446
    abi = syscall(create_ruleset, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return 0
    fs_write = (
        (1 << 1)  # WRITE_FILE
        | (1 << 4)  # REMOVE_DIR
        | (1 << 5)  # REMOVE_FILE
        | (1 << 6)  # MAKE_CHAR
        | (1 << 7)  # MAKE_DIR
        | (1 << 8)  # MAKE_REG
        | (1 << 9)  # MAKE_SOCK
        | (1 << 10)  # MAKE_FIFO
        | (1 << 11)  # MAKE_BLOCK
        | (1 << 12)  # MAKE_SYM
    )
    if abi >= 2:
        fs_write |= 1 << 13  # REFER
    if abi >= 3:
        fs_write |= 1 << 14  # TRUNCATE
    net = 0b11 if abi >= 4 else 0  # BIND_TCP | CONNECT_TCP, no rule added: all TCP denied
    scoped = 0b11 if abi >= 6 else 0  # abstract unix sockets, signals outside the sandbox

    class RulesetAttr(ctypes.Structure):
        _fields_ = [
            ("handled_access_fs", ctypes.c_uint64),
            ("handled_access_net", ctypes.c_uint64),
            ("scoped", ctypes.c_uint64),
        ]

    class PathBeneathAttr(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = RulesetAttr(fs_write, net, scoped)
    size = 24 if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = syscall(create_ruleset, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return 0
    dir_fd = os.open(work_dir, os.O_PATH | os.O_DIRECTORY)
    try:
        rule = PathBeneathAttr(fs_write, dir_fd)
        if syscall(add_rule, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule), 0) != 0:
            return 0
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            return 0
        if syscall(restrict_self, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return 0
    finally:
        os.close(dir_fd)
        os.close(ruleset)
    return int(abi)


# Syscalls refused with EPERM: process/thread creation, exec, sockets, signals to others.
_SECCOMP_DENY: dict[str, tuple[int, tuple[int, ...]]] = {
    # machine: (AUDIT_ARCH_*, syscall numbers)
    "x86_64": (
        0xC000003E,
        (56, 57, 58, 59, 322, 435, 41, 53, 62, 200, 234),
        # clone fork vfork execve execveat clone3 socket socketpair kill tkill tgkill
    ),
    "aarch64": (
        0xC00000B7,
        (220, 221, 281, 435, 198, 199, 129, 130, 131),
        # clone execve execveat clone3 socket socketpair kill tkill tgkill
    ),
}


def _seccomp() -> bool:
    """Install the deny-list filter; False where the architecture is not covered or it failed."""
    import ctypes
    import platform

    entry = _SECCOMP_DENY.get(platform.machine())
    if entry is None:
        return False
    arch, denied = entry

    class SockFilter(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_uint16),
            ("jt", ctypes.c_uint8),
            ("jf", ctypes.c_uint8),
            ("k", ctypes.c_uint32),
        ]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    load_word, jump_eq, ret = 0x20, 0x15, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    n = len(denied)
    program = [
        SockFilter(load_word, 0, 0, 4),  # seccomp_data.arch
        SockFilter(jump_eq, 1, 0, arch),
        SockFilter(ret, 0, 0, allow),
        SockFilter(load_word, 0, 0, 0),  # seccomp_data.nr
        *(SockFilter(jump_eq, n - i, 0, nr) for i, nr in enumerate(denied)),
        SockFilter(ret, 0, 0, allow),
        SockFilter(ret, 0, 0, deny),
    ]
    filters = (SockFilter * len(program))(*program)
    fprog = SockFprog(len(program), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        return False
    return bool(libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0)  # PR_SET_SECCOMP, FILTER


def _limits(config: dict[str, int]) -> None:
    import resource

    def cap(which: int, value: int) -> None:
        resource.setrlimit(which, (value, value))

    cap(resource.RLIMIT_CPU, config["cpu_s"])
    cap(resource.RLIMIT_AS, config["memory_bytes"])
    cap(resource.RLIMIT_FSIZE, config["max_file_bytes"])
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_NOFILE, 64)
    # No new processes or threads (the kernel exempts real root: the seccomp filter covers it).
    cap(resource.RLIMIT_NPROC, 0)


_BLOCKED_EVENTS = (
    "os.fork",
    "os.forkpty",
    "os.posix_spawn",
    "os.spawn",
    "os.exec",
    "os.system",
    "os.kill",
    "os.killpg",
    "subprocess.Popen",
    "socket.__new__",
    "socket.connect",
    "socket.bind",
    "socket.getaddrinfo",
    "ctypes.dlopen",
    "ctypes.dlsym",
    "ctypes.call_function",
    "ctypes.cdata",
    "_posixsubprocess",
    "pty.spawn",
    "signal.pthread_kill",
    "sys.addaudithook",
)
_WRITE_PATH_EVENTS = (
    "os.remove",
    "os.rename",
    "os.rmdir",
    "os.mkdir",
    "os.symlink",
    "os.link",
    "os.chmod",
    "os.chown",
    "os.truncate",
    "os.utime",
    "shutil.rmtree",
)


def _install_audit_hook(work_dir: str) -> None:
    """Refuse process creation, sockets, ctypes and writes outside ``work_dir`` with a clear error.

    A second line behind the kernel limits, and the only one for writes where Landlock is missing.
    """
    root = os.path.realpath(work_dir)

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor: the open itself was checked
        try:
            if isinstance(path, bytes):
                path = os.fsdecode(path)
            full = os.path.realpath(os.path.join(root, str(path)))
        except Exception:
            return False
        return full == root or full.startswith(root + os.sep)

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event.startswith(_BLOCKED_EVENTS):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int)
                and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            )
            if writing and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} outside the working directory")
        elif event in _WRITE_PATH_EVENTS:
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
            if any(not inside(os.fspath(p)) for p in paths):
                raise PermissionError(f"sandbox: {event} outside the working directory")

    sys.addaudithook(hook)


def main() -> None:
    config = json.loads(sys.argv[1])
    with os.fdopen(config["nonce_fd"], "r") as nonce_pipe:
        nonce = nonce_pipe.read()
    marker_fd: int = config["marker_fd"]
    with open(config["program_path"], encoding="utf-8") as f:
        program = f.read()
    tests = config.get("tests")
    work_dir = config["work_dir"]
    os.chdir(work_dir)
    import resource  # noqa: F401  (imported before the limits, which it sets)
    import traceback  # noqa: F401  (needed after the limits to report errors)

    _landlock(work_dir)
    _seccomp()
    sys.modules.pop("ctypes", None)
    _limits(config)
    if config.get("audit_hook", True):
        _install_audit_hook(work_dir)

    namespace: dict[str, object] = {"__name__": "__main__", "__builtins__": __builtins__}
    exit_ok_counts = tests is None  # stdin/stdout programs may end with sys.exit(0)
    try:
        exec(compile(program, "solution.py", "exec"), namespace)
        if tests is not None:
            exec(compile(tests, "tests.py", "exec"), namespace)
    except SystemExit as exc:
        if not (exit_ok_counts and exc.code in (None, 0)):
            sys.stderr.write(f"sandbox: program exited with {exc.code!r}\n")
            sys.stderr.flush()
            os._exit(1)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    os.write(marker_fd, nonce.encode())
    os._exit(0)


if __name__ == "__main__":
    main()
