"""SQL console: read-only SQL over the store, results as a table.

For the questions the views do not anticipate. ``studio.queries.console`` checks every query
against DuckDB's parse tree first (one SELECT over the store's tables, nothing that reaches
files or the environment), runs it under the store's time limit off the server's event
loop, and returns at most 1,000 rows. A refused or failing query says why in place.
"""
from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import panel as pn
import param

from studio.queries import console
from studio.store import QueryTimeout, schema

from .base.jobs import Job
from .base.state import StudioState
from .base.style import CSS, banner, esc

PICK = "examples…"


def display_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A result as the table shows it: lists, arrays and JSON become text."""
    out = frame.copy()
    for col in out.columns:
        if out[col].dtype == object:
            out[col] = [v if v is None or isinstance(v, (str, int, float, bool)) else
                        (str(list(v)) if isinstance(v, (list, tuple, np.ndarray)) else str(v)) for v in out[col]]
    return out


def tables_html() -> str:
    """The store's tables and columns, as a reference beside the editor."""
    rows = "".join(f'<div><b>{esc(t)}</b> <span class="cols">{esc(", ".join(schema.columns(t)))}</span></div>'
                   for t in schema.TABLES)
    return f'<div class="sql-tables">{rows}</div>'


SQL_CSS = """
.sql-tables { font-size:11.5px; line-height:1.45; color:#495057; max-height:440px; overflow:auto; }
.sql-tables b { font-family:'DejaVu Sans Mono', monospace; color:#1f2937; }
.sql-tables .cols { font-family:'DejaVu Sans Mono', monospace; color:#868e96; }
"""


class SQLConsole(pn.viewable.Viewer):
    """Editor, examples, Run, and the result table."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    sql = param.String(default=console.EXAMPLES["Rollouts per run and step"], doc="The query to run.")
    running = param.Boolean(default=False, doc="Whether a query is running.")

    def __init__(self, **params):
        super().__init__(**params)
        self._editor = pn.widgets.CodeEditor.from_param(self.param.sql, language="sql", height=170,
                                                        sizing_mode="stretch_width", css_classes=["sql-editor"])
        self._examples = pn.widgets.Select(options=[PICK, *console.EXAMPLES], value=PICK, width=260,
                                           css_classes=["sql-examples"])
        self._examples.param.watch(self._pick_example, "value")
        self._run = pn.widgets.Button(name="Run (read-only)", color="primary", width=150,
                                      css_classes=["sql-run"])
        self._run.on_click(self._on_run)
        self._job = Job(on_running=self._running)  # one query at a time, off the event loop
        self._message = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", css_classes=["sql-message"])
        self._table = pn.widgets.Tabulator(pd.DataFrame(), pagination="local", page_size=15, disabled=True, layout="fit_data_fill",
                                           sizing_mode="stretch_width", show_index=False,
                                           css_classes=["sql-result"], visible=False)
        self._layout = pn.Row(
            pn.Column(self._editor, pn.Row(self._run, self._examples), self._message, self._table,
                      sizing_mode="stretch_width", styles={"flex": "1 1 70%"}),
            pn.Column(pn.pane.HTML('<div style="font-size:11px;font-weight:700;color:#6b7280;letter-spacing:.06em;'
                                   'text-transform:uppercase">Tables</div>'),
                      pn.pane.HTML(tables_html(), stylesheets=[CSS, SQL_CSS], sizing_mode="stretch_width"),
                      styles={"flex": "0 0 300px"}, width=300),
            sizing_mode="stretch_width")

    def _pick_example(self, event) -> None:
        if event.new != PICK:
            self.sql = console.EXAMPLES[event.new]
            self._examples.value = PICK

    def _running(self, on: bool) -> None:
        self.running, self._run.disabled = on, on

    async def _on_run(self, event=None) -> None:
        if self.running:
            return
        with self._job.claim():
            self._message.object = banner("info", "Running…")
            try:
                result = await self._job.thread(console.run, self.state.store, self.sql)
            except console.ReadOnlyError as exc:
                self._message.object = banner("error", f"Not run: {exc}.")
                return
            except QueryTimeout as exc:
                self._message.object = banner("error", str(exc))
                return
            except duckdb.Error as exc:
                self._message.object = banner("error", f"DuckDB: {str(exc).splitlines()[0]}")
                return
        more = f" (the first {len(result.frame):,}: more rows matched)" if result.truncated else ""
        self._message.object = (f'<div class="meta-line sql-summary"><span><b class="sql-rows">{len(result.frame):,}'
                                f'</b> rows{more}</span><span>{result.seconds * 1000:,.0f} ms</span></div>')
        self._table.value = display_frame(result.frame)
        self._table.visible = True

    def __panel__(self):
        return self._layout
