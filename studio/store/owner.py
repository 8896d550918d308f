"""Which process a run or a commit belongs to: ``host:pid``, and whether that process is gone."""
from __future__ import annotations

import os
import socket

OWNER = f"{socket.gethostname()}:{os.getpid()}"  # what this process writes into runs.owner and its commits


def owner_gone(owner: str | None) -> bool:
    """True when ``owner`` ("host:pid") ran on this machine and that process no longer exists."""
    host, _, pid = (owner or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False
