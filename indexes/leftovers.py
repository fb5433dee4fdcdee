"""Temporary copies next to a target (a snapshot file being written, a root being restored)
named so that a later run can tell a killed run's leftover from one still in progress.

A killed ``restore`` or ``snapshot`` left a full copy (``.NAME.restore-*``, ``.NAME.tmp-*``)
that no later run removed. The name carries the host and the process id of its writer; a run
to the same target removes the ones of this host whose process is gone. Another host's (a
shared file system) and a live process's are left alone: their writer may still be at work.
"""

from __future__ import annotations

import glob
import logging
import os
import secrets
import shutil
import socket
from pathlib import Path

log = logging.getLogger(__name__)


def temporary_path(target: Path, kind: str) -> Path:
    """A new name beside ``target`` for a copy of ``kind`` ("restore", "tmp") this process
    writes, renamed onto ``target`` once whole."""
    return target.parent / f"{_prefix(target, kind)}{os.getpid()}-{secrets.token_hex(4)}"


def sweep(target: Path, kind: str) -> list[Path]:
    """Remove the copies of ``kind`` beside ``target`` left by this host's processes that are
    gone (killed mid-run); returns what was removed."""
    prefix = _prefix(target, kind)
    removed = []
    for path in target.parent.glob(glob.escape(prefix) + "*"):
        pid = path.name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        log.info("removed %s, left by process %s that is gone (killed mid-run)", path, pid)
        removed.append(path)
    return removed


def _prefix(target: Path, kind: str) -> str:
    return f".{target.name}.{kind}-{socket.gethostname()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
