"""Token texts for ids stored in the store (the hover card's top-k alternatives).

Only the tokenizer's ``tokenizer.json`` is read, with the ``tokenizers`` library (not
transformers, which would import torch into the server), once per policy per process.
"""
from __future__ import annotations

import functools
from pathlib import Path

SAMPLE_POLICY = "sample"  # how runs of the bundled sample policy name it (portable across machines)


def resolve_policy(policy: str | Path | None) -> Path | None:
    """The folder of a policy as a run records it; ``"sample"`` is the bundled sample policy."""
    if policy is None:
        return None
    if str(policy) == SAMPLE_POLICY:
        from sample_data import POLICY_DIR
        return POLICY_DIR
    return Path(policy).expanduser()


def policy_label(path: str | Path) -> str:
    """What a run stores as its policy: ``"sample"`` for the bundled one, else the absolute path."""
    from sample_data import POLICY_DIR

    p = Path(path).expanduser().resolve()
    return SAMPLE_POLICY if p == POLICY_DIR.resolve() else str(p)


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def decode_ids(policy: str | None, ids: list[int]) -> list[str]:
    """Each id as display text; ``#id`` when the policy's tokenizer is unavailable."""
    folder = resolve_policy(policy)
    file = folder / "tokenizer.json" if folder is not None else None
    try:
        tok = _tokenizer(str(file)) if file is not None and file.is_file() else None
    except Exception:  # an unreadable tokenizer only costs the alternatives' text
        tok = None
    if tok is None:
        return [f"#{i}" for i in ids]
    return tok.decode_batch([[int(i)] for i in ids], skip_special_tokens=False)
