"""The OS boundary of `agentrl.sandbox`: the bubblewrap (`bwrap`) command line and its seccomp filter.

bubblewrap is the unprivileged sandbox Flatpak runs its apps in (Debian/Ubuntu/Fedora package
`bubblewrap`); it sets up the namespaces, mounts and capabilities from a command line, so nothing here
creates a namespace by hand. The seccomp filter is compiled with libseccomp (`libseccomp2`, a
dependency of systemd, so present on nearly every Linux system) through ctypes and handed to bwrap as
BPF on a pipe (`--seccomp FD`).

What the child gets (docs/envs.md, "The sandbox"):

- new user, mount, PID, network, IPC, UTS and cgroup namespaces; uid/gid 65534 inside; no
  capabilities; no new user namespaces inside (`--disable-userns`);
- read-only: /usr (and the /bin, /lib* links or directories), /etc/ld.so.cache, the Python
  installation (base prefix, venv) and the child script; scikit-learn's bundled dataset files are
  hidden (they hold the test labels); nothing else of the host (no home, no project, no /tmp, no /sys);
- its own /proc (its PID namespace only), read-only, and a minimal /dev, read-only except the devices;
- one writable place: a tmpfs of `disk_mb` at /sandbox (working directory, HOME, TMPDIR);
- a network namespace with only its own loopback;
- seccomp: no new processes (fork, vfork, clone without CLONE_THREAD), no ptrace, mount, namespaces,
  BPF, perf, keyrings, io_uring, kernel modules and a few more (EPERM);
- the environment from `--clearenv` and the variables given, nothing inherited.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import shutil
import sys
import tempfile

BWRAP = "bwrap"
#: where the child sees its script and its writable directory
CHILD_PATH = "/run/agentrl/sandbox_child.py"
WORKDIR = "/sandbox"
SANDBOX_UID = 65534  # "nobody" inside the user namespace

#: Denied outright (EPERM): process inspection, mounts and namespaces, kernel interfaces a numeric
#: library never needs and that widen the kernel's attack surface.
DENIED_SYSCALLS = (
    "fork",
    "vfork",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "quotactl",
    "open_by_handle_at",
    "name_to_handle_at",
    "fanotify_init",
    "lookup_dcookie",
    "uselib",
    "personality",
    "vhangup",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
)
_CLONE_THREAD = 0x00010000
_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_MASKED_EQ = 7


def _scmp_act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


@functools.cache
def seccomp_program() -> bytes | None:
    """The compiled BPF filter for this machine's architecture, or None without libseccomp."""
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        return None
    try:
        deny = _scmp_act_errno(errno.EPERM)

        def rule(action: int, syscall: str, *cmps: _ArgCmp) -> None:
            number = lib.seccomp_syscall_resolve_name(syscall.encode())
            if number < 0:  # not a syscall of this architecture
                return
            array = (_ArgCmp * len(cmps))(*cmps) if cmps else None
            if lib.seccomp_rule_add_array(ctx, action, number, len(cmps), array) != 0:
                raise OSError(f"libseccomp refused the rule for {syscall}")

        for syscall in DENIED_SYSCALLS:
            rule(deny, syscall)
        # clone makes threads (CLONE_THREAD) and processes; only threads are allowed. clone3 passes its
        # flags in memory, out of the filter's reach: ENOSYS makes the C library fall back to clone.
        rule(deny, "clone", _ArgCmp(0, _SCMP_CMP_MASKED_EQ, _CLONE_THREAD, 0))
        rule(_scmp_act_errno(errno.ENOSYS), "clone3")
        with tempfile.TemporaryFile() as out:
            if lib.seccomp_export_bpf(ctx, out.fileno()) != 0:
                return None
            out.seek(0)
            return out.read()
    except OSError:
        return None
    finally:
        lib.seccomp_release(ctx)


def seccomp_fd() -> int | None:
    """A pipe's read end holding the BPF program (bwrap reads it once), or None without libseccomp."""
    program = seccomp_program()
    if program is None:
        return None
    read, write = os.pipe()
    try:
        os.write(write, program)  # a few KB: fits in the pipe's buffer
    finally:
        os.close(write)
    return read


def python_roots() -> list[str]:
    """The directories the interpreter and its packages live in (base prefix, venv, extra sys.path
    entries of site-packages), real paths, without ones nested in another."""
    candidates = {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix}
    candidates |= {p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)}
    real = sorted({os.path.realpath(p) for p in candidates if os.path.isdir(p)})
    return [p for p in real if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in real)]


def hidden_dirs() -> list[str]:
    """Directories of the Python installation the child must not see: scikit-learn's bundled datasets
    (the env's data, test labels included)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return []
    data = os.path.join(os.path.realpath(list(spec.submodule_search_locations)[0]), "datasets", "data")
    return [data] if os.path.isdir(data) else []


def python_executable() -> str:
    """The interpreter's path as the child sees it: in the venv's real directory, so that the venv's
    pyvenv.cfg (next to bin/) is found."""
    prefix = os.path.realpath(sys.prefix)
    candidate = os.path.join(prefix, "bin", os.path.basename(sys.executable))
    return candidate if os.path.exists(candidate) else os.path.realpath(sys.executable)


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return args


def bwrap_command(
    child_script: str, env: dict[str, str], disk_mb: int, seccomp: int | None, child_args: list[str]
) -> list[str]:
    """The bwrap command line that runs `python -I child_script` in the sandbox."""
    args = [
        shutil.which(BWRAP) or BWRAP,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--hostname",
        "sandbox",
        "--cap-drop",
        "ALL",
        *_system_binds(),
    ]
    for root in python_roots():
        args += ["--ro-bind", root, root]
    for hidden in hidden_dirs():
        args += ["--tmpfs", hidden, "--remount-ro", hidden]
    # /proc read-only: run by root, the sandbox's uid maps to root outside, and the kernel's files under
    # /proc/sys, /proc/irq, /proc/acpi check only that uid, not capabilities.
    args += [
        "--ro-bind",
        child_script,
        CHILD_PATH,
        "--proc",
        "/proc",
        "--remount-ro",
        "/proc",
        "--dev",
        "/dev",
    ]
    args += ["--size", str(disk_mb * 1024 * 1024), "--tmpfs", WORKDIR, "--chdir", WORKDIR]
    # bwrap's own root and /dev are tmpfs mounts without a size: read-only, so /sandbox is the only
    # writable place and the only one bounded in size.
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--clearenv"]
    for name, value in env.items():
        args += ["--setenv", name, value]
    if seccomp is not None:
        args += ["--seccomp", str(seccomp)]
    # -B: no bytecode written anywhere (the interpreter would try beside each uncompiled module)
    return [*args, "--", python_executable(), "-I", "-B", CHILD_PATH, *child_args]
