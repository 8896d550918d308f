"""What the process knows about policies, shared by every page it serves: the policies a
picker can offer (the bundled ones and every mini-run checkpoint in a store) and the device a
local policy's worker reported once it ran.

Process-wide, not per page: a device learned by one session's Generate is shown in every
session's backend line.
"""
from __future__ import annotations

import threading
from pathlib import Path

from sample_data import CHAT_POLICY_DIR, EARLY_POLICY_DIR, POLICY_DIR
from studio.runs import minirun
from studio.store import Store

_devices: dict[str, str] = {}  # resolved policy folder -> device its worker reported ("cpu", "cuda")
_lock = threading.Lock()


def known_policies(store: Store) -> dict[str, str]:
    """Label -> folder of every policy a picker can offer: the bundled ones (the arithmetic world's
    two, the realistic world's chat policy) and every mini-run checkpoint in the store."""
    out = {"sample policy": str(POLICY_DIR), "sample policy (early checkpoint)": str(EARLY_POLICY_DIR),
           "sample chat policy (word problems)": str(CHAT_POLICY_DIR)}
    for r in minirun.checkpoints(store).itertuples():
        out[f"{r.name} · step {int(r.step)}"] = r.path
    return out


def local_device(policy: str | Path) -> str | None:
    """The device a local policy folder's worker reported, once it has run (else None)."""
    with _lock:
        return _devices.get(str(Path(policy).resolve()))


def note_local_device(policy: str | Path, device: str) -> None:
    """Remember that a local policy folder's worker ran on ``device``."""
    with _lock:
        _devices[str(Path(policy).resolve())] = device
