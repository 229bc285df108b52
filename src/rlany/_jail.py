"""The jail: how a sandbox is built (host side) and entered (inside), standard library only.

Host side, `bwrap_argv(...)`: the bubblewrap command line. bwrap (Debian's `bubblewrap`)
gives the program new mount, PID, IPC, UTS, network and cgroup namespaces and a root that
holds only, read-only: /usr (libc, sh), the interpreter's prefix with its site-packages
hidden under an empty tmpfs (the stdlib only), a fresh /proc and a minimal /dev; writable:
a private tmpfs at /tmp (cwd and HOME) and at /dev/shm. Nothing else of the host exists
in there: not its /run/lock, /var/tmp, home, the checkout (/work/...) nor run directories.
The PID namespace dies with bwrap, so killing bwrap kills every process of the run.

Inside, this file runs as a script before the program (a fresh single-threaded
interpreter, so unshare/mount/setuid are safe here):

    python -I -S -c "$(cat _jail.py)" '{"uid": ..., "cpu_s": ..., "argv": [...], ...}'

It optionally enters namespaces itself (the `unshare` fallback, root without bwrap), sets
rlimits (CPU, address space, file size, open files, no core, processes), drops to a fresh
uid (root modes), then execs the program's interpreter with a clean environment.
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWUTS = 0x20000, 0x40000000, 0x8000000, 0x4000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 16384, 1 << 18
TMPFS_BYTES = 64 * 1024 * 1024
MASKED_BY_UNSHARE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/run/shm")


def _parents_0755(path: str) -> list[str]:
    """bwrap copies a bound path's missing parents with the host's modes (0700 for /root):
    create them world-searchable first so the dropped uid can reach the interpreter."""
    args, parts = [], path.strip("/").split("/")[:-1]
    for i in range(len(parts)):
        args += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i + 1])]
    return args


def bwrap_argv(bwrap: str, interpreter: str, as_root: bool) -> list[str]:
    """The bwrap command (up to and excluding the command it runs); see the module doc."""
    import site
    argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent",
            "--new-session", "--clearenv"]
    if as_root:  # keep only what the jail needs to drop to its fresh uid (then none)
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    prefixes = {os.path.realpath(sys.base_prefix),
                os.path.dirname(os.path.dirname(os.path.realpath(interpreter)))}
    for prefix in sorted(p for p in prefixes if not _under(p, "/usr")):
        argv += _parents_0755(prefix) + ["--ro-bind", prefix, prefix]
    for packages in site.getsitepackages(sorted(prefixes)):  # the stdlib only, no torch
        if os.path.isdir(packages):
            argv += ["--perms", "0555", "--size", "4096", "--tmpfs", packages,
                     "--remount-ro", packages]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for tmp in ("/tmp", "/dev/shm"):
        argv += ["--perms", "1777", "--size", str(TMPFS_BYTES), "--tmpfs", tmp]
    return argv + ["--remount-ro", "/", "--chdir", "/tmp"]


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


def unshare_namespaces() -> None:
    """The fallback when bwrap is missing (root only): new network, mount, IPC and UTS
    namespaces with private tmpfs over the usual writable dirs. The rest of the host's
    filesystem stays visible (read-only to the dropped uid where its modes say so)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) != 0:
        sys.stderr.write(f"jail: unshare failed (errno {ctypes.get_errno()})\n")
        sys.exit(97)
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        sys.exit(97)
    for target in MASKED_BY_UNSHARE:
        opts = f"size={TMPFS_BYTES},mode=1777".encode()
        if os.path.isdir(target) and not os.path.islink(target) and libc.mount(
                b"tmpfs", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
            sys.exit(97)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg.get("unshare"):
        unshare_namespaces()
    work = cfg["work"]
    if not os.path.isdir(work):  # unshare mode: a dir of its own on the private /tmp
        os.mkdir(work, 0o700)
        if cfg.get("uid") is not None:
            os.chown(work, cfg["uid"], cfg["uid"])
    os.chdir(work)
    cpu = max(1, int(cfg["cpu_s"] + 0.999))
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_mb"] * mb, cfg["memory_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_mb"] * mb, cfg["file_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (cfg["open_files"], cfg["open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cfg.get("uid") is not None:
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])  # NPROC is not enforced for root: set it as the new uid
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work,
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    os.execve(cfg["argv"][0], cfg["argv"], env)


if __name__ == "__main__":
    main()
