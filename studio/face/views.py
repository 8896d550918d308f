"""What a :class:`studio.face.api.Studio` shows: Panel components on its shared session state
(token strip, group view, fork panel, table, any tab by name, the whole page) and
self-contained HTML files.

Every component made by one ``Studio`` shares its session state (:attr:`StudioViews.state`), as
the views of one browser page do: picking a row in ``s.table()`` shows that rollout in every
``s.token_view()`` made without an id. A view made for a given id has its own state.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from studio.face.checks import StudioAPIError, arg_path, arg_text, check_channel
from studio.face.tabs import VIEWS

if TYPE_CHECKING:  # Panel is imported only when a component is asked for
    import panel as pn


class StudioViews:
    """The view methods of :class:`studio.face.api.Studio` (a mixin: it reads ``store``,
    ``policy``, ``rollout`` and ``_group_id`` of the studio)."""

    @property
    def state(self):
        """The session state every component of this studio shares (a ``StudioState``)."""
        if self._state is None:
            self._state = self._new_state()
        return self._state

    def _new_state(self, **values):
        setup_notebook()
        from widgets.base.state import StudioState

        return StudioState(store=self.store, policy_path=self.policy, **values)

    def _refresh(self) -> None:
        if self._state is not None:
            self._state.refresh += 1

    def _view_state(self, rollout_id: str | None = None, group_id: str | None = None, **values):
        """The shared state when no id is given, else a state of its own opened on the id."""
        if rollout_id is None and group_id is None:
            st = self.state
            st.param.update(**values)
            return st
        st = self._new_state(**values)
        if rollout_id is not None:
            self.rollout(rollout_id)  # a clear error for an unknown id
            st.open_rollout(rollout_id)
        else:
            st.group_id = group_id
        return st

    def token_view(self, rollout_id: str | None = None, channel: str = "entropy") -> pn.viewable.Viewable:
        """A rollout's token strip with its colour-channel picker and hover cards. Without an
        id it follows the rollout picked in :meth:`table` (or :attr:`state`)."""
        import panel as pn

        from widgets.base.style import CSS
        from widgets.token_strip import TokenStrip

        check_channel(channel)
        st = self._view_state(rollout_id, channel=channel)
        picker = pn.widgets.RadioButtonGroup.from_param(st.param.channel, name="Colour tokens by", color="light",
                                                        css_classes=["channel-picker"])
        # room below the strip for the hover card: a notebook's output area clips what overflows it
        return pn.Column(picker, TokenStrip(state=st), sizing_mode="stretch_width", stylesheets=[CSS],
                         css_classes=["studio-token-view"], styles={"padding-bottom": "170px"})

    def group_view(self, group: str | None = None) -> pn.viewable.Viewable:
        """All completions of one group (a group id, or a prompt id: its newest group) side by
        side with rewards and advantages; without an argument it follows :attr:`state`."""
        from widgets.group_view import GroupView

        st = self._view_state(group_id=self._group_id(group) if group else None)
        return GroupView(state=st)

    def fork_view(self, rollout_id: str | None = None) -> pn.viewable.Viewable:
        """A rollout's fork panel: alternatives at the picked token, Branch, and its rollout tree."""
        from widgets.fork_panel import ForkPanel

        return ForkPanel(state=self._view_state(rollout_id))

    def table(self, run: str | None = None) -> pn.viewable.Viewable:
        """The rollout table with its filters; picking a row opens it in the shared state's views."""
        import panel as pn

        from widgets.rollout_table import RolloutTable

        st = self.state
        if run:
            st.jump_run = run
        t = RolloutTable(state=st)
        return pn.Row(pn.Column(t.controls, width=300), t, sizing_mode="stretch_width")

    def explorer(self) -> pn.viewable.Viewable:
        """Table, token strip and group view of the shared state together: a small studio."""
        import panel as pn

        return pn.Column(self.table(), pn.Row(self.token_view(), self.fork_view(), sizing_mode="stretch_width"),
                         self.group_view(), sizing_mode="stretch_width")

    def view(self, name: str) -> pn.viewable.Viewable:
        """One of the studio's tabs as a component on the shared state, by its tab name:
        ``"entropy landscape"``, ``"compare policies"``, ``"reward rules"``, ``"reward hacking"``,
        ``"advantages & steps"``, ``"mini-runs"``, ``"preference data"``, ``"timeline & diff"``,
        ``"import & enrich"``, ``"sql"`` (see :data:`studio.face.tabs.VIEWS`)."""
        key = arg_text("name", name, optional=False).strip().lower()
        if key not in VIEWS:
            raise StudioAPIError(f"no view {name!r}; one of {', '.join(VIEWS)}")
        return VIEWS[key].build(self.state, shown=True)  # a lazy view drawn now, as a tab is when it is opened

    def app(self) -> pn.viewable.Viewable:
        """The whole studio page, on this store and policy."""
        setup_notebook()
        from studio.face.app import create_app

        return create_app(self.store.path, self.policy, store=self.store)

    # -- static HTML -----------------------------------------------------------------------
    def save_html(self, path: str | Path, *, rollout: str | None = None, group: str | None = None,
                  fork_tree: str | None = None, channel: str = "entropy", title: str | None = None) -> Path:
        """Write one self-contained HTML file of a rollout's token strip, a group, or a
        rollout's fork tree: it opens in any browser without a server, hover cards included.
        Returns the path written."""
        from studio.face.static_html import save_html

        arg_path("path", path)
        for k, v in (("rollout", rollout), ("group", group), ("fork_tree", fork_tree), ("title", title)):
            arg_text(k, v)
        given = [k for k, v in (("rollout", rollout), ("group", group), ("fork_tree", fork_tree)) if v]
        if len(given) != 1:
            raise StudioAPIError("give exactly one of rollout=, group=, fork_tree=")
        check_channel(channel)
        return save_html(self, Path(path), rollout=rollout, group=self._group_id(group) if group else None,
                         fork_tree=fork_tree, channel=channel, title=title)


def setup_notebook() -> None:
    """Set up Panel for notebooks, offline: every resource inline (``widgets.runtime.notebook.setup``)."""
    from widgets.runtime.notebook import setup

    setup()
