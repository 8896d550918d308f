"""How a token's text is shown: invisible characters made visible, special tokens marked, numbers
printed without a "-0.000". The token strip, the fork panel and the entropy views share these."""
from __future__ import annotations

SPECIAL_DISPLAY = {"\n": "↵", "\t": "⇥"}


VISIBLE_WS = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥"})  # in the card, whitespace must be seen


def token_display(text: str) -> tuple[str, bool]:
    """What to print for a token and whether it is a special/invisible one."""
    if text.startswith("<") and text.endswith(">") and len(text) > 2:
        return text, True
    if text in SPECIAL_DISPLAY:
        return SPECIAL_DISPLAY[text], True
    return text, False


def num(x: float | None, spec: str = ".3f") -> str:
    """Format without a "-0.000": round first, then drop the sign of zero; "–" for a value not
    there (None or NaN: an imported token without the statistic, a tool response's token)."""
    if x is None or x != x:
        return "–"
    return format(round(float(x), 3) + 0.0, spec)
