"""Child processes that die with rlany: an OpenEnv server a stage started, a trainer the
loop launched. The child starts as a small Python script that asks the kernel to SIGTERM it
when its parent dies (PR_SET_PDEATHSIG, Linux; kept across exec), checks that its parent is
still the process that started it (a parent that died first would never send it), then
execs the command, so the command keeps the child's process id. A command that cannot be
started exits 1 with one line naming it."""

from __future__ import annotations

import os
import sys

_WITH_PARENT = ("import ctypes, os, signal, sys\n"
                "try:\n    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
                "except Exception:\n    pass\n"
                "if os.getppid() != int(sys.argv[1]):\n    sys.exit(1)\n"
                "try:\n    os.execvp(sys.argv[2], sys.argv[2:])\n"
                "except OSError as e:\n"
                "    sys.exit(f'cannot start {sys.argv[2]!r}: {e.strerror}')\n")


def dying_with_us(argv: list[str]) -> list[str]:
    """The argv that runs `argv` as a child that dies with this process."""
    return [sys.executable, "-c", _WITH_PARENT, str(os.getpid()), *argv]
