"""How the rollout table shows its rows: its columns, each row's cells (the turns cell, the fork
mark, correctness as a tick), the line naming the rule versions a page's rewards come from."""
from __future__ import annotations

import pandas as pd

from . import mismatch_columns as mm

# the shown columns and the two a click needs (hidden): every column is sent to the browser and
# taken row by row by Panel on each click, so the page frame holds nothing else
COLUMNS = ["rollout_id", "prompt", "completion", "turns", "reward", "advantage", "correct", "n_tokens", "fork_pos",
           *mm.MM_COLUMNS, "group_id"]


def as_shown(rows: pd.DataFrame) -> pd.DataFrame:
    """A page's rows as the table shows them (made where the page is read: after new rows, on the
    preload thread, not on the event loop that serves every page), the rule versions of their rewards
    in ``attrs["versions"]`` (the line above the rows names them)."""
    turns = [turns_label(*c) for c in zip(rows["n_turns"], rows["n_tool_calls"], rows["n_tool_errors"], strict=True)]
    df = rows.reindex(columns=COLUMNS).reset_index(drop=True)
    df["turns"] = pd.Series(turns, dtype=object)
    df["correct"] = [None if pd.isna(x) else bool(x) for x in df["correct"]]  # blank: nothing to check against
    df["correct"] = df["correct"].astype(object)
    source = rows.attrs.get("reward_source")
    df.attrs["versions_note"] = source.note if source is not None else None
    df.attrs["versions"] = tuple(dict.fromkeys(rows["version"].dropna()))
    df["fork_pos"] = ["" if pd.isna(x) else f"↳ {int(x)}" for x in df["fork_pos"]]  # branches only
    df["rejected"] = ""  # text (✗ where rejected) where the mismatch columns are read
    for c in ("rollout_id", "group_id", "prompt", "completion", "fork_pos", "turns", "rejected"):  # plain objects: Panel's row takes
        df[c] = df[c].astype(object)  # on each click cost a pyarrow call per Arrow-backed column
    return df


def turns_label(n_turns, n_calls, n_errors) -> str:
    """A row's turns cell: ``3·2⚙·1✗`` (turns, tool calls, failed calls; the zeros left out), narrow
    enough for the table's card beside the sidebar.

    >>> turns_label(5, 2, 1), turns_label(3, 1, 0), turns_label(None, None, None)
    ('5·2⚙·1✗', '3·1⚙', '1')
    """
    def count(v, default: int) -> int:
        return default if v is None or pd.isna(v) else int(v)

    calls, errors = count(n_calls, 0), count(n_errors, 0)
    return "·".join([str(count(n_turns, 1))] + ([f"{calls}⚙"] if calls else []) + ([f"{errors}✗"] if errors else []))


def versions_line(versions: tuple[str, ...]) -> str:
    """Whose rewards a page shows: its rows' rule versions (each row's latest scoring may differ)."""
    if not versions:
        return "no rewards scored"
    if len(versions) == 1:
        return f"rewards from {versions[0]}"
    return f"rewards from {len(versions)} rule versions: {', '.join(versions)} (each row its latest scoring)"
