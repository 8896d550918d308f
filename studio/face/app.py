"""The served studio: the page's composition (the sidebar, the cards, the tabs of :mod:`studio.face.tabs`).

``create_app`` builds one browser session's page. The store is opened once per server
process and shared by every session (one owner of the DuckDB file).
"""
from __future__ import annotations

import json
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import panel as pn

from sample_data import CHAT_POLICY_DIR, POLICY_DIR, SEED_DIRS
from studio.store import Store, StoreError, default_db_path

TITLE = "Rollout Studio"


def open_shared_store(db_path: str | Path) -> Store:
    """The process-wide store for ``db_path`` (created and seeded on first use)."""
    where = str(db_path) if "://" in str(db_path) else Path(db_path).expanduser().resolve()  # a team catalog's URL
    key = f"rollout-studio-store:{where}"
    return pn.state.as_cached(key, lambda: Store.open(db_path, seed_dir=SEED_DIRS))


class StudioTemplate(pn.template.BootstrapTemplate):
    """Panel's Bootstrap template, put on a page with Bokeh's model graph frozen: the graph is
    walked once for the whole page instead of once per root added (a third of a page's build).

    Once a served page is built, its HTML panes get their full stylesheets in one walk
    (``widgets.runtime.panel_updates.prime_stylesheets``) and its objects are frozen out of the cyclic
    garbage collector (``widgets.runtime.page_gc``).

    Without Panel's busy indicator: it is one process-wide flag that every callback of every
    session sets on every open page's spinner, so with twenty pages a click costs forty model
    updates in nineteen other pages (and each page's spinner turned with everyone's clicks).
    """

    def __init__(self, **params):
        params.setdefault("busy_indicator", None)
        super().__init__(**params)

    def _init_doc(self, doc=None, comm=None, title=None, notebook=False, location=True):
        if doc is None:
            return super()._init_doc(doc, comm, title, notebook, location)
        with doc.models.freeze():
            built = super()._init_doc(doc, comm, title, notebook, location)
        from widgets.runtime import page_gc, panel_updates

        if doc.session_context is not None:  # a served page, once built: see the two modules
            doc.add_next_tick_callback(
                lambda: panel_updates.prime_stylesheets([*self.header, *self.sidebar, *self.main, *self.modal], doc))
            page_gc.track(doc)
        return built


def describe_policy(path: str | Path) -> str:
    """One line naming the policy folder and its architecture (or the backend URL)."""
    from backends import is_policy_url

    if is_policy_url(path):  # its health and device are in the Generate card's backend line
        return f"remote backend {path}"
    p = Path(path)
    try:
        cfg = json.loads((p / "config.json").read_text())
        arch = cfg.get("model_type", "?")
    except (OSError, ValueError):
        return f"{p} (not a model folder: Generate will say why)"
    name = {POLICY_DIR.resolve(): "sample policy", CHAT_POLICY_DIR.resolve(): "sample chat policy"}.get(p.resolve(), p.name)
    return f"{name} · {arch}"  # where it runs: the Generate card's backend line, once the worker says


def refusal_page(message: str) -> StudioTemplate:
    """A page that only explains why the studio will not serve here."""
    from widgets.base.style import CSS, banner

    template = StudioTemplate(title=TITLE, header_background="#1f2937")
    template.main.append(pn.pane.HTML(banner("error", message), stylesheets=[CSS], sizing_mode="stretch_width"))
    return template


def may_run_code(admins: frozenset[str] | None) -> bool:
    """Whether this session's user may start code-running work (Generate, later rules and
    mini-runs): everyone when no admins are configured, else only the named users."""
    return admins is None or (pn.state.user or "") in admins


def create_app(db_path: str | Path | None = None, policy_path: str | Path | None = None,
               store: Store | None = None, admins: frozenset[str] | None = None) -> StudioTemplate:
    """Build the studio page for one session.

    With ``admins`` set, users outside it browse only: the Generate panel is not built for
    their session at all, so no callback exists that could run code on their behalf.
    """
    from studio.face.lower_tabs import LowerTabs
    from studio.queries import lookups
    from studio.runs.registry import known_policies
    from widgets.base.state import StudioState
    from widgets.base.style import CARD_CSS, CSS, banner, esc
    from widgets.credit_panel import credit_controls
    from widgets.fork_panel import ForkPanel, fork_controls
    from widgets.generate_panel import GeneratePanel
    from widgets.mismatch_controls import mismatch_card
    from widgets.rollout_table import RolloutTable
    from widgets.rule_panel import version_picker
    from widgets.runtime import errors, panel_updates
    from widgets.token_strip import TokenStrip

    pn.extension("tabulator", "codeeditor", design="bootstrap", notifications=False)
    panel_updates.install()  # updates skip Panel's design lookup unless stylesheets change
    db_path = db_path or default_db_path()
    policy_path = policy_path or POLICY_DIR  # a folder, or a backend URL (a str: Path would mangle "//")
    # Bootstrap rather than Fast: Fast's design fetches a web font, and the studio must
    # render with no network.
    template = StudioTemplate(
        title=TITLE, header_background="#1f2937", sidebar_width=340,
    )
    errors.install(template)  # a callback's failure shows on this page (a red banner) and is logged once
    try:
        store = store or open_shared_store(db_path)
    except StoreError as exc:
        template.main.append(pn.pane.HTML(banner("error", str(exc)), stylesheets=[CSS], sizing_mode="stretch_width"))
        return template

    state = StudioState(store=store, policy_path=str(policy_path))
    table = RolloutTable(state=state)
    strip = TokenStrip(state=state)
    runs_code = may_run_code(admins)
    fork = ForkPanel(state=state, can_run=runs_code)

    counts = state.fresh_read(("counts",), store.counts)
    policies = state.fresh_read(("policies",), lambda: known_policies(store))

    def info_html(refresh: int, policy: str) -> str:  # re-drawn whenever new rollouts are stored
        n = counts()["rollouts"]
        return (f'<div class="meta-line" style="flex-direction:column;gap:2px">'
                f'<span>{"shared store" if store.shared else "store"} <b>{esc(Path(store.path).name)}</b> · '
                f'{n:,} rollouts</span>'
                f'<span>policy <b>{esc(describe_policy(policy))}</b></span></div>')

    info = pn.pane.HTML(pn.bind(info_html, state.param.refresh, state.param.policy_path), stylesheets=[CSS],
                        sizing_mode="stretch_width", margin=(0, 10), css_classes=["store-info"])
    # the session's policy (Generate, Branch): the bundled ones and every mini-run checkpoint
    policy_pick = pn.widgets.Select(name="Policy for Generate and Branch", sizing_mode="stretch_width",
                                    css_classes=["policy-picker"])

    def sync_policies(*_):
        opts = dict(policies())
        if str(state.policy_path) not in opts.values():
            opts[describe_policy(state.policy_path)] = str(state.policy_path)
        policy_pick.options = opts
        policy_pick.value = str(state.policy_path)

    sync_policies()
    state.param.watch(sync_policies, ["refresh"])
    policy_pick.param.watch(lambda e: setattr(state, "policy_path", e.new), "value")
    group = dict(sizing_mode="stretch_width", header_background="#f1f3f5", margin=(6, 8), collapsible=True,
                 styles={"border-radius": "6px"}, stylesheets=[CARD_CSS])
    if runs_code:
        run_code = pn.Card(policy_pick, GeneratePanel(state=state), title="Generate", collapsed=False,
                           css_classes=["generate-card"], **{**group, "header_background": "#eef2ff"})
    else:
        run_code = pn.pane.HTML(
            banner("info", f"Signed in as {pn.state.user}: browsing only. Generate and other code-running "
                           f"actions are for {', '.join(sorted(admins))}."),
            stylesheets=[CSS], sizing_mode="stretch_width", css_classes=["browse-only"])

    def section(title: str) -> pn.pane.HTML:
        return pn.pane.HTML(f'<div style="font-size:11px;font-weight:700;letter-spacing:.06em;color:#6b7280;'
                            f'text-transform:uppercase">{esc(title)}</div>', margin=(8, 10, 0, 10))

    channel = pn.widgets.RadioButtonGroup.from_param(state.param.channel, name="Colour tokens by",
                                                     color="light", sizing_mode="stretch_width",
                                                     css_classes=["channel-picker"],
                                                     # five channels in the sidebar's width
                                                     stylesheets=[".bk-btn { padding:4px 3px; font-size:12px; }"])
    # in the order of use: which rollouts, what the colours show, then generating more; the
    # settings of one estimator or of forks fold away until wanted
    template.sidebar.extend([
        info,
        section("Rollouts"), pn.Column(table.controls, css_classes=["table-filters"], sizing_mode="stretch_width",
                                       margin=0),
        section("Colour tokens by"), channel, version_picker(state),
        pn.Card(fork_controls(state), title="Fork markers", collapsed=True, css_classes=["fork-card"], **group),
        pn.Card(credit_controls(state), title="Advantages & steps", collapsed=True, css_classes=["credit-card"],
                **group),
        mismatch_card(state, **group),
        run_code,
    ])
    tabs = LowerTabs(state, can_run=runs_code)
    first = lookups.informative_rollout(store)  # the page opens on a group with right and wrong answers
    if first:
        state.open_rollout(first)

    async def tail_refresh() -> None:  # rows from elsewhere: every view reloads, its reads on the preload thread
        with table.arrivals():  # (the table's rows stay put while a person clicks through them)
            await state.stored()
        tabs.stored()

    follow_tails(store, tail_refresh)
    card = dict(sizing_mode="stretch_width", collapsible=False, header_background="#f8f9fa", margin=(6, 6))
    save_html = html_downloads(state)
    template.main.extend([
        pn.Row(
            pn.Card(table, title="Rollouts", **card, styles={"flex": "1 1 55%"}),
            pn.Column(
                pn.Card(strip, save_html, title="Token strip", **card, min_height=260),
                pn.Card(fork, title="Fork & branch", **card),
                styles={"flex": "1 1 45%"}, sizing_mode="stretch_width"),
            sizing_mode="stretch_width",
        ),
        tabs.panel,
    ])
    template.header.append(pn.pane.HTML(
        '<span style="color:#cbd5e1;font-size:13px">per-token logprobs, entropy and advantages of every '
        "stored rollout</span>", margin=(14, 10)))
    return template


@dataclass
class _Page:
    doc: weakref.ref
    store: Store
    seen: tuple[int, int]
    refresh: Callable[[], Awaitable[None]]


_PAGES: dict[int, _Page] = {}  # the served pages of this process, by id(document)


def follow_tails(store: Store, refresh: Callable[[], Awaitable[None]]) -> None:
    """Run ``refresh`` in this served page whenever rollouts arrive in the store from elsewhere:
    the store's folder tailers, or (a shared store) another process's commits.

    One check every 2 s for the whole server (:func:`_poll_tails`), not a periodic callback per
    page: twenty open pages would otherwise wake the server ten times a second to find nothing.
    """
    doc = pn.state.curdoc
    if doc is None or doc.session_context is None:  # not a served page (a notebook, a test)
        return
    key = id(doc)
    _PAGES[key] = _Page(weakref.ref(doc), store, _arrivals(store), refresh)
    doc.on_session_destroyed(lambda _ctx: _PAGES.pop(key, None))
    pn.state.schedule_task("rollout-studio-tails", _poll_tails, period="2s")  # once per process


def _arrivals(store: Store) -> tuple[int, int]:
    """What changes when rows arrive from elsewhere: the tailers' rollouts, and another process's
    latest commit to a shared store (``Store.change_mark``; 0 for a file)."""
    from studio.ingest.tailers import tail_rows

    try:
        mark = store.change_mark()
    except StoreError:  # a catalog out of reach for a moment: look again at the next poll
        mark = -1
    return tail_rows(store), mark


def _poll_tails() -> None:
    seen: dict[str, tuple[int, int]] = {}
    for key, page in list(_PAGES.items()):
        doc = page.doc()
        if doc is None or doc.session_context is None:
            _PAGES.pop(key, None)
            continue
        now = seen.get(page.store.path) or seen.setdefault(page.store.path, _arrivals(page.store))
        if now[1] == -1:
            continue
        if now != page.seen:
            page.seen = now
            doc.add_next_tick_callback(page.refresh)  # in that page's session, with its lock


def html_downloads(state) -> pn.FlexBox:
    """*Save as HTML*: the shown rollout, its group or its fork tree as one self-contained page
    (``studio.face.static_html``, the same rendering as ``Studio.save_html``), built on click."""
    import io

    from studio.face.api import Studio
    from studio.face.static_html import fork_tree_html, group_html, rollout_html

    def make(render, kind: str) -> pn.widgets.FileDownload:
        def callback():
            studio = Studio(state.store, state.policy_path)
            key = state.group_id if kind == "group" else state.rollout_id
            button.filename = f"{kind}-{key[-8:]}.html"  # named when pressed: a rollout click sends nothing here
            return io.BytesIO(render(studio, key, state.channel).encode("utf-8"))
        button = pn.widgets.FileDownload(callback=callback, filename=f"{kind}.html", label=kind.replace("-", " "),
                                         color="light", embed=False, height=30, width=88, disabled=True,
                                         css_classes=[f"save-{kind}"])
        return button

    buttons = {"rollout": make(rollout_html, "rollout"), "group": make(group_html, "group"),
               "fork-tree": make(fork_tree_html, "fork-tree")}

    def sync(*_):
        for button in buttons.values():
            button.disabled = not state.rollout_id

    state.param.watch(sync, ["rollout_id"])
    sync()
    label = pn.pane.HTML('<span style="font-size:12px;color:#6b7280" title="one self-contained page that opens in any '
                         'browser without a server, hover cards included">Save as HTML</span>', margin=(0, 2, 0, 10))
    return pn.FlexBox(label, *buttons.values(), flex_wrap="wrap", align_items="center", css_classes=["save-html"],
                      margin=(0, 0, 4, 0), sizing_mode="stretch_width")

