"""Colour scales, legends and CSS shared by every view, so one colour means one thing.

Every string that came from a model or a user goes through :func:`esc` before it is
placed in HTML: tokens and completions are shown as text, never interpreted.
"""
from __future__ import annotations

import functools
import html
from dataclasses import dataclass

ACCENT = "#3b5bdb"
# a horizontal rule between a view's sections, as HTML: Panel's Divider, made inside a callback (a tab
# built when first opened), links its stylesheet from Panel's CDN, which the offline studio never reaches
DIVIDER_HTML = '<hr style="border:none; border-top:1px solid #dee2e6; margin:8px 0">'


def esc(text: object) -> str:
    """HTML-escape anything shown to the user (quotes included)."""
    return html.escape(str(text), quote=True)


@dataclass(frozen=True)
class Scale:
    """A clipped linear colour scale with its legend text."""

    name: str
    label: str
    lo: float
    hi: float
    stops: tuple[str, ...]
    help: str
    fmt: str = "{:.2f}"

    def frac(self, v: float | None) -> float | None:
        if v is None or v != v:  # None or NaN
            return None
        return min(1.0, max(0.0, (float(v) - self.lo) / (self.hi - self.lo)))

    def color(self, v: float | None) -> str:
        return self.colors(v)[0]

    def text_color(self, v: float | None) -> str:
        return self.colors(v)[1]

    def colors(self, v: float | None) -> tuple[str, str]:
        """The background for ``v`` and the text colour readable on it (one computation: a strip
        asks for both of every token's value)."""
        f = self.frac(v)
        if f is None:
            return "#f1f3f5", "#1b1e23"
        stops = self._stops_rgb
        seg = f * (len(stops) - 1)
        i = min(int(seg), len(stops) - 2)
        (r0, g0, b0), (r1, g1, b1) = stops[i], stops[i + 1]
        t = seg - i
        r, g, b = round(r0 + (r1 - r0) * t), round(g0 + (g1 - g0) * t), round(b0 + (b1 - b0) * t)
        return "#%02x%02x%02x" % (r, g, b), "#ffffff" if 0.299 * r + 0.587 * g + 0.114 * b < 140 else "#1b1e23"

    @functools.cached_property
    def _stops_rgb(self) -> tuple[tuple[int, int, int], ...]:
        return tuple(_rgb(c) for c in self.stops)

    def legend_html(self, compact: bool = False) -> str:
        """The scale's legend line; ``compact`` keeps the explanation in the hover title only
        (for secondary scales stacked under a main one)."""
        grad = ", ".join(self.stops)
        mid = (self.lo + self.hi) / 2
        help_text = f"{self.help} · clipped at the ends · mid {self.fmt.format(mid)}"
        return (
            f'<div class="legend" title="{esc(help_text)}"><span class="lg-name">{esc(self.label)}</span>'
            f'<span class="lg-lo">{esc(self.fmt.format(self.lo))}</span>'
            f'<span class="lg-bar" style="background:linear-gradient(90deg,{grad})"></span>'
            f'<span class="lg-hi">{esc(self.fmt.format(self.hi))}</span>'
            + ('<span class="lg-info">i</span></div>' if compact else f'<span class="lg-help">{esc(help_text)}</span></div>')
        )


def _rgb(hexstr: str) -> tuple[int, int, int]:
    h = hexstr.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


SCALES: dict[str, Scale] = {
    "logprob": Scale("logprob", "log-prob", -6.0, 0.0,
                     ("#3a0ca3", "#7048e8", "#b197fc", "#e5dbff", "#ffffff"),
                     "log π(token | context): darker = more surprising to the policy"),
    "entropy": Scale("entropy", "entropy (nats)", 0.0, 2.0,
                     ("#ffffff", "#ffe8cc", "#ffa94d", "#f76707", "#c2410c"),
                     "entropy of the full next-token distribution: darker = the policy was unsure"),
    "advantage": Scale("advantage", "advantage", -2.0, 2.0,
                       ("#b2182b", "#ef8a62", "#fddbc7", "#f7f7f7", "#d1e5f0", "#67a9cf", "#2166ac"),
                       "each token's advantage under the sidebar's estimator: red pushed down, blue pushed up"),
    "weight": Scale("weight", "effective weight", -2.0, 2.0,
                    ("#b2182b", "#ef8a62", "#fddbc7", "#f7f7f7", "#d1e5f0", "#67a9cf", "#2166ac"),
                    "advantage × loss mask × entropy mask: what an 80/20-style update trains on; "
                    "tokens below the fork threshold get 0 (white)"),
    "mismatch": Scale("mismatch", "Δ = log π_train − log π_behaviour", -1.0, 1.0,
                      ("#1c4f9c", "#5b8fd6", "#c5d8f2", "#f7f7f7", "#f6c9c4", "#e0685c", "#a51d1d"),
                      "each token's training–inference mismatch, nats: blue = the trainer gives the token less "
                      "probability than the sampler, red = more; grey = no Δ (not recomputed, or a tool token)",
                      fmt="{:+.1f}"),
}

CHANNELS = list(SCALES)

STEP_SCALE = Scale("step", "step reward", -1.0, 1.0,
                   ("#b2182b", "#ef8a62", "#fddbc7", "#f7f7f7", "#d1e5f0", "#67a9cf", "#2166ac"),
                   "bars under each step's tokens: the step reward from the chosen source")


# Panes redrawn on every click carry the studio's CSS only, not Panel's design: for every update
# the design makes its four stylesheets again (all of Bootstrap among them) for Panel to match
# against the ones the pane has (~1.5 ms a pane, a few per click), and the studio's CSS styles
# everything these panes show.
REDRAWN = {"design": None}
# a folded card's chevron drawn: the page's CSS leaves Panel's chevron (an SVG line) without a stroke
CARD_CSS = ".card-button svg { stroke:#495057; }"

CSS = """
:host { --accent: %(accent)s; font-family: Inter, 'Segoe UI', system-ui, sans-serif; }
.legend { display:flex; align-items:center; gap:6px; font-size:12px; color:#495057; flex-wrap:wrap; }
.lg-name { font-weight:600; color:#212529; }
.lg-info { color:#868e96; cursor:help; font-size:9px; font-weight:700; display:inline-block; width:11px; height:11px;
           line-height:11px; text-align:center; border:1px solid #adb5bd; border-radius:50%%; }
.lg-bar { width:140px; height:10px; border-radius:3px; border:1px solid #dee2e6; display:inline-block; }
.lg-help { flex-basis:100%%; color:#868e96; font-size:11px; }
.strip { font-family: 'JetBrains Mono', 'DejaVu Sans Mono', Menlo, monospace; font-size:15px; line-height:2.1;
         padding:6px 2px 60px 2px; word-break:break-all; }
.strip.compact { font-size:13px; line-height:1.8; padding-bottom:4px; }
.tok { position:relative; padding:2px 1px; border-radius:3px; white-space:pre; cursor:default;
       border-bottom:3px solid transparent; }
.tok.step-ok { border-bottom-color:#37b24d; }
.tok.step-bad { border-bottom-color:#e03131; }
.tok.special { color:#868e96; font-style:italic; font-size:0.8em; }
.tok:hover { outline:2px solid #212529; z-index:5; }
.clickable .tok { cursor:pointer; }
.stepbox { display:inline-flex; flex-direction:column; vertical-align:top; border-left:2px solid #adb5bd;
           padding-left:1px; margin:0 2px 4px 1px; }
.stepbox .sbody { white-space:pre-wrap; }
.stepbox .sbar { display:block; height:14px; margin-top:2px; border-radius:2px; font-size:10px; line-height:14px;
                 text-align:center; font-family:'DejaVu Sans Mono', monospace; overflow:hidden; }
.stepbox .sbar.none { background:repeating-linear-gradient(45deg,#f1f3f5,#f1f3f5 3px,#fff 3px,#fff 6px); color:#adb5bd; }
.tok.fork::before { content:""; position:absolute; left:50%%; top:-5px; margin-left:-4px; border:4px solid transparent;
                    border-top:5px solid #1f2937; }
.tok.picked { outline:2px solid var(--accent); outline-offset:1px; z-index:4; }
.strip .fork-key { font-size:11px; color:#495057; }
.fork-mark { display:inline-block; width:0; height:0; border:4px solid transparent; border-top:5px solid #1f2937;
             vertical-align:middle; margin:0 3px 0 2px; }
.tok .card { display:none; position:absolute; left:0; top:1.9em; z-index:20; min-width:220px; background:#fff;
             color:#212529; border:1px solid #ced4da; border-radius:6px; box-shadow:0 6px 18px rgba(0,0,0,.15);
             padding:8px 10px; font-size:12px; line-height:1.45; white-space:normal; word-break:normal;
             font-family: Inter, 'Segoe UI', system-ui, sans-serif; }
.tok:hover .card { display:block; }
.tok.card-left .card { left:auto; right:0; }
.card .c-tok { font-family:'DejaVu Sans Mono', monospace; font-size:14px; font-weight:700; }
.card .c-row { display:flex; justify-content:space-between; gap:12px; }
.card .c-k { color:#868e96; }
.card table { border-collapse:collapse; width:100%%; margin-top:4px; }
.card td { padding:1px 4px; }
.card td.alt { font-family:'DejaVu Sans Mono', monospace; }
.card tr.chosen td { font-weight:700; background:#f1f3f5; }
.card .pbar { height:8px; background:var(--accent); border-radius:2px; display:inline-block; }
.meta-line { font-size:12px; color:#495057; display:flex; gap:14px; flex-wrap:wrap; margin:2px 0 6px 0; }
.meta-line b { color:#212529; }
.meta-line .version { color:#868e96; font-size:11px; }
.chip { display:inline-block; padding:1px 7px; border-radius:10px; font-size:12px; font-weight:600; }
.ok { color:#2b8a3e; } .bad { color:#c92a2a; }
.banner { padding:6px 10px; border-radius:6px; font-size:13px; margin:4px 0; }
.banner.warn { background:#fff4e6; border:1px solid #ffc078; color:#873800; }
.banner.info { background:#e7f5ff; border:1px solid #a5d8ff; color:#1864ab; }
.banner.error { background:#fff5f5; border:1px solid #ffa8a8; color:#a61e4d; white-space:pre-wrap; }
.empty { color:#868e96; font-size:13px; padding:12px 4px; }
.badge { display:inline-block; padding:0 6px; border-radius:8px; font-size:11px; font-weight:700; }
.badge.pivotal { background:#ffe3e3; color:#c92a2a; border:1px solid #ffa8a8; }
.badge.calm { background:#f1f3f5; color:#495057; }
a.link, .link { color:var(--accent); cursor:pointer; text-decoration:underline dotted; }
.muted { color:#868e96; font-weight:400; }
.convo { display:flex; flex-direction:column; gap:4px; margin:2px 0; }
.convo .turn { display:grid; grid-template-columns:60px minmax(0, 1fr); gap:6px; align-items:start; }
.convo .role { font-size:11px; font-weight:600; color:#868e96; padding-top:5px; text-align:right; white-space:nowrap; }
.convo .say { font-size:13px; line-height:1.45; color:#343a40; white-space:pre-wrap; word-break:break-word;
              background:#f8f9fa; border:1px solid #e9ecef; border-radius:6px; padding:4px 8px; max-height:9.5em;
              overflow:auto; }
.convo .turn.system .say { color:#6b7280; font-size:12px; background:#fff; border-style:dashed; }
.convo .turn.assistant .role { color:#3b5bdb; padding-top:10px; }
.convo .say-strip { min-width:0; }
.strip.plain-text { font-size:13.5px; line-height:1.6; white-space:pre-wrap; word-break:break-word; padding-bottom:6px; }
.think-block { display:block; background:#f6f4ff; border-left:3px solid #b197fc; border-radius:4px;
               padding:0 6px 2px 6px; margin:2px 0 6px 0; }
.think-label { display:block; font-family:Inter, 'Segoe UI', system-ui, sans-serif; font-size:10px; font-weight:700;
               letter-spacing:.06em; text-transform:uppercase; color:#7048e8; line-height:1.6; padding-top:2px; }
.tok.answer { box-shadow:0 -2px 0 #1971c2, 0 2px 0 #1971c2; }
.tok.answer.a-first { box-shadow:-2px 0 0 #1971c2, 0 -2px 0 #1971c2, 0 2px 0 #1971c2; }
.tok.answer.a-last { box-shadow:2px 0 0 #1971c2, 0 -2px 0 #1971c2, 0 2px 0 #1971c2; }
.tok.answer.a-first.a-last { box-shadow:0 0 0 2px #1971c2; }
.think-swatch { display:inline-block; width:14px; height:10px; background:#f6f4ff; border-left:3px solid #b197fc; }
.answer-swatch { display:inline-block; width:14px; height:10px; border:2px solid #1971c2; border-radius:2px;
                 margin-left:8px; }
.tok.masked { background:#e9ecef; color:#868e96; }
.mm-clipped { text-decoration:underline dotted #1f2937 2px; text-underline-offset:5px; }
.mm-masked { text-decoration:underline wavy #c92a2a 1.5px; text-underline-offset:5px; }
.mm-swatch { font-family:'DejaVu Sans Mono', monospace; font-size:11px; color:#495057; text-underline-offset:1px; }
.card .c-sec { border-top:1px solid #e9ecef; margin-top:4px; padding-top:3px; }
.card table.mm-lp { margin:0 0 2px 0; } .card table.mm-lp td { text-align:right; padding:0 3px; }
.card table.mm-lp td:first-child { text-align:left; padding-left:0; }
.card .mm-verdict.kept { color:#2b8a3e; } .card .mm-verdict.clipped { color:#1f2937; }
.card .mm-verdict.masked, .card .mm-verdict.rejected { color:#c92a2a; }
.tok.masked-run { background:#e9ecef; color:#868e96; border:1px dashed #ced4da; font-size:0.8em; white-space:nowrap;
                  font-family:Inter, 'Segoe UI', system-ui, sans-serif; }
.convo.trajectory { gap:3px; padding-bottom:60px; }
.convo.trajectory .strip { padding-bottom:2px; }
.convo .role .t-idx { display:block; font-weight:400; font-size:10px; color:#adb5bd; }
.convo .turn.tool .role { color:#868e96; }
.convo .say.inside { margin:2px 0; }
.tool-call, .tool-reply { font-size:12px; border-radius:6px; padding:3px 8px; margin:2px 0 4px 0; min-width:0; }
.tool-call { background:#f8f9ff; border:1px solid #dbe4ff; border-left:3px solid #5c7cfa; color:#343a40; }
.tool-reply { background:#f1f3f5; border:1px dashed #ced4da; border-left:3px solid #adb5bd; color:#6b7280; }
.tool-reply.failed { border-left:3px solid #e03131; background:#fff5f5; }
.t-head { display:flex; align-items:baseline; gap:6px; flex-wrap:wrap; }
.t-icon { color:#868e96; } .tool-call .t-icon { color:#5c7cfa; }
.t-what { color:#868e96; } .t-size { color:#adb5bd; font-size:11px; }
.t-name { font-family:'DejaVu Sans Mono', monospace; color:#212529; }
.tool-reply .t-name { color:#495057; }
.masked-tag { font-size:10px; font-weight:700; letter-spacing:.05em; text-transform:uppercase; color:#868e96;
              background:#e9ecef; border:1px solid #dee2e6; border-radius:8px; padding:0 6px; }
.t-body { font-family:'DejaVu Sans Mono', monospace; font-size:12px; line-height:1.45; white-space:pre-wrap;
          word-break:break-all; overflow-wrap:anywhere; max-height:10em; overflow-y:auto; overflow-x:hidden; }
.t-error { color:#c92a2a; margin:1px 0; white-space:pre-wrap; overflow-wrap:anywhere; }
.turn-bars { display:flex; flex-wrap:wrap; gap:4px 14px; font-size:11px; margin:1px 0 5px 0; }
.tbar { display:inline-flex; align-items:center; gap:5px; }
.tb-src { color:#868e96; max-width:180px; overflow:hidden; text-overflow:ellipsis; white-space:nowrap; }
.tbar.adv .tb-src { color:#495057; font-weight:600; }
.tb-track { position:relative; width:84px; height:9px; background:#f1f3f5; border:1px solid #e9ecef; border-radius:2px; }
.tb-track::after { content:""; position:absolute; left:50%%; top:-2px; bottom:-2px; border-left:1px solid #868e96; }
.tb-fill { position:absolute; top:0; bottom:0; border-radius:1px; }
.tb-val { font-family:'DejaVu Sans Mono', monospace; font-weight:700; color:#212529; min-width:3.2em; }
.tbar.none .tb-val { color:#adb5bd; font-weight:400; }
.turn-key .key { white-space:nowrap; display:inline-flex; align-items:center; gap:4px; margin-right:8px; }
.masked-swatch, .failed-swatch, .call-swatch { display:inline-block; width:14px; height:10px; border-radius:2px; }
.masked-swatch { background:#e9ecef; border:1px dashed #adb5bd; }
.failed-swatch { background:#fff5f5; border-left:3px solid #e03131; }
.call-swatch { background:#f8f9ff; border-left:3px solid #5c7cfa; }
.traj-chips { font-size:11px; color:#495057; display:flex; gap:8px; flex-wrap:wrap; margin:0 0 3px 0; }
.traj-chips b { color:#212529; }
""" % {"accent": ACCENT}


def banner(kind: str, text: str) -> str:
    """A message box; ``kind`` is warn, info or error. The text is escaped."""
    return f'<div class="banner {esc(kind)}">{esc(text)}</div>'


def chip(value: float | None, scale: Scale) -> str:
    """A small coloured badge showing ``value`` on ``scale``."""
    if value is None or value != value:
        return '<span class="chip" style="background:#f1f3f5">–</span>'
    bg, fg = scale.colors(value)
    return (f'<span class="chip" style="background:{bg};color:{fg}">'
            f'{esc(scale.fmt.format(value))}</span>')
