"""Static HTML export: one self-contained file of a rollout, a group or a fork tree.

The file is what the served views draw, rendered by the same widgets (``TokenStrip``,
``GroupView``, ``tree_html``) from the same queries, with their stylesheets inlined: a rollout
as its conversation (system and user turns, then the assistant's tokens with the reasoning
band and the answer outlined; an agent trajectory turn by turn, with its tool calls, masked tool
responses and per-turn bars, :mod:`widgets.turn_blocks`; a group's page shows the prompt's turns
once, every trajectory's own turns kept). Hover
cards are pure CSS (``.tok:hover .card``), so they work from ``file://`` with no script and
no server; nothing is loaded from the network (system fonts only). Every token and text is
escaped by the widgets: a completion that contains ``<script>`` shows it as text.
"""
from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import TYPE_CHECKING

from widgets.base.style import CSS, esc

if TYPE_CHECKING:
    from studio.face.api import Studio

PAGE_CSS = """
:root, body { --accent: #3b5bdb; }
body { margin:0; background:#f8f9fa; color:#212529; font-family: Inter, 'Segoe UI', system-ui, sans-serif; }
header.top { background:#1f2937; color:#f8f9fa; padding:10px 18px; display:flex; gap:14px; align-items:baseline; }
header.top h1 { font-size:16px; margin:0; font-weight:600; }
header.top span { color:#cbd5e1; font-size:12px; }
main { padding:12px 18px 40px 18px; max-width:1200px; }
section.box { background:#fff; border:1px solid #dee2e6; border-radius:8px; padding:8px 12px; margin:10px 0; }
section.box h2 { font-size:13px; margin:0 0 6px 0; color:#495057; font-weight:700; letter-spacing:.02em; }
section.box h2 code { font-weight:400; color:#868e96; }
footer { color:#868e96; font-size:11px; margin-top:18px; }
.link, a.link { cursor:default; text-decoration:none; color:inherit; }
.comp { cursor:default; }
.strip { padding-bottom:10px; }
section.box { position:relative; }
section.box:hover { z-index:30; }
"""


def _host_free(css: str) -> str:
    """The widgets' stylesheets target a shadow root (``:host``); a plain page has none."""
    return css.replace(":host", ":root")


def _page(title: str, subtitle: str, sections: list[tuple[str, str]], extra_css: list[str]) -> str:
    from widgets.fork_marks import FORK_CSS  # the tree's marks on a strip (◆ pivotal)

    css = "\n".join(_host_free(c) for c in [CSS, FORK_CSS, *extra_css]) + PAGE_CSS
    body = "".join(f'<section class="box"><h2>{h}</h2>{html}</section>' for h, html in sections)
    stamp = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta name="generator" content="Rollout Studio">'
            f"<title>{esc(title)}</title><style>{css}</style></head><body>"
            f'<header class="top"><h1>{esc(title)}</h1><span>{esc(subtitle)}</span></header>'
            f"<main>{body}<footer>Exported by Rollout Studio on {esc(stamp)}. Hover a token for its card: "
            "log-prob, entropy and the policy's top alternatives.</footer></main></body></html>\n")


def _strip_parts(studio: Studio, rollout_id: str, channel: str) -> tuple[str, str, str]:
    """(header, legend, strip) of a rollout as the token strip draws them."""
    from widgets.token_strip import TokenStrip

    st = studio._new_state(channel=channel)
    st.open_rollout(rollout_id)
    view = TokenStrip(state=st)
    header, legend, strip = view.__panel__().objects[:3]  # (then the Enrich action: not part of a page)
    legend_html = legend.object.replace(" · click any token to branch there", "")  # nothing to click in a file
    return header.object, legend_html, strip.object


# a turn before the assistant's as the token strip draws it (its text is escaped: it holds no '<')
PROMPT_TURN = re.compile(r'<div class="turn (?!assistant)[^"]*"><span class="role">[^<]*</span>'
                         r'<div class="say">[^<]*</div></div>')


def _subtitle(*parts) -> str:
    """Parts that are known, joined (an import has no policy: never a 'None')."""
    return " · ".join(str(p) for p in parts if p is not None and p == p and str(p))


def rollout_html(studio: Studio, rollout_id: str, channel: str = "entropy", title: str | None = None) -> str:
    ro = studio.rollout(rollout_id)
    head, legend, strip = _strip_parts(studio, rollout_id, channel)
    return _page(title or f"Rollout {rollout_id}", _subtitle(ro.get("run"), ro.get("policy"), f"coloured by {channel}"),
                 [(f"Token strip <code>{esc(rollout_id)}</code>", head + legend + strip)], [])


def group_html(studio: Studio, group_id: str, channel: str = "entropy", title: str | None = None) -> str:
    """The group's summary as the group view draws it, then every completion's full strip."""
    from widgets.group_view import GRID_CSS, GroupView

    st = studio._new_state(channel=channel)
    st.group_id = group_id
    view = GroupView(state=st)
    summary = view.__panel__().objects[1].object  # the header line and the equal-rewards banner
    df = studio.group(group_id)
    sections = []
    for i, r in enumerate(df.itertuples(index=False)):
        head, legend, strip = _strip_parts(studio, r.rollout_id, channel)
        if i == 0:  # one legend for the page: every completion shares the scale and the fork threshold
            sections.append((f"Group <code>{esc(group_id)}</code>", summary + legend))
        else:  # one prompt: its turns are shown with the first completion
            strip = PROMPT_TURN.sub("", strip)
        sections.append((f"#{int(r.sample_idx)} <code>{esc(r.rollout_id)}</code>", head + strip))
    first = df.iloc[0]
    return _page(title or f"Group of {first['prompt']}", f"{len(df)} completions · coloured by {channel}",
                 sections, [GRID_CSS])


def fork_tree_html(studio: Studio, rollout_id: str, channel: str = "entropy", title: str | None = None) -> str:
    """The rollout's strip, then its tree: every fork with its branches' values and completions."""
    from studio import queries
    from studio.queries import forks
    from widgets.fork_panel import TREE_CSS, tree_html

    studio.rollout(rollout_id)
    tdf = forks.tree(studio.store, rollout_id)
    tree = tree_html(studio.store, rollout_id, tdf, forks.forks(studio.store, tdf), queries.reward_bounds(studio.store))
    # what only the served panel can do: fill the table, open a completion and branch it again
    tree = re.sub(r' · <span class="link" data-click="branches"[^>]*>show all in table</span>', "", tree)
    tree = tree.replace(" (click one to open it; branch it again there)", "")
    head, legend, strip = _strip_parts(studio, rollout_id, channel)
    return _page(title or f"Fork tree of {rollout_id}", f"coloured by {channel}",
                 [(f"Token strip <code>{esc(rollout_id)}</code>", head + legend + strip), ("Rollout tree", tree)],
                 [TREE_CSS])


def save_html(studio: Studio, path: Path, *, rollout: str | None = None, group: str | None = None,
              fork_tree: str | None = None, channel: str = "entropy", title: str | None = None) -> Path:
    """Write the page for exactly one of ``rollout`` / ``group`` / ``fork_tree`` to ``path``
    (``.html`` added when it has no suffix); written whole then renamed, so a failed export
    never leaves half a file. Returns the path written."""
    if rollout:
        html = rollout_html(studio, rollout, channel, title)
    elif group:
        html = group_html(studio, group, channel, title)
    else:
        html = fork_tree_html(studio, fork_tree, channel, title)
    path = Path(path).expanduser()
    if not path.suffix:
        path = path.with_suffix(".html")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(path)
    return path
