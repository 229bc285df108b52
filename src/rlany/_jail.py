"""Enter the sandbox, then exec the program's interpreter. Run as a script by sandbox.py:

    python -I -S _jail.py '{"uid": ..., "cpu_s": ..., "memory_mb": ..., "argv": [...]}'

It is a fresh single-threaded process, so unshare/mount/setuid are safe here. Standalone on
purpose: it imports nothing from rlany and only the standard library's os/ctypes/json.
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 16384, 1 << 18


def namespaces(uid: int) -> str:
    """New network + mount namespaces with private tmpfs dirs; returns the work dir."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
        sys.stderr.write(f"jail: unshare failed (errno {ctypes.get_errno()})\n")
        sys.exit(97)
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        sys.exit(97)
    for target in (b"/tmp", b"/var/tmp", b"/dev/shm"):
        if os.path.isdir(target) and libc.mount(b"tmpfs", target, b"tmpfs", MS_NOSUID | MS_NODEV,
                                                 b"size=64m,mode=1777") != 0:
            sys.exit(97)
    work = "/tmp/work"
    os.mkdir(work, 0o700)
    os.chown(work, uid, uid)
    return work


def main() -> None:
    cfg = json.loads(sys.argv[1])
    root = os.geteuid() == 0
    work = namespaces(cfg["uid"]) if root else cfg["work"]
    os.chdir(work)
    cpu = max(1, int(cfg["cpu_s"] + 0.999))
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_mb"] * mb, cfg["memory_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_mb"] * mb, cfg["file_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (cfg["open_files"], cfg["open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if root:
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])  # NPROC is not enforced for root: set it as the new uid
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work,
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    os.execve(cfg["argv"][0], cfg["argv"], env)


main()
