"""The Python API: the studio from a script or a notebook, on the code paths the UI runs.

    >>> import studio
    >>> s = studio.open(":memory:")            # a path, or no argument for the embedded default
    >>> s.rollouts(correct=False).shape[0]     # DataFrames, filtered in DuckDB
    0

In JupyterLab, ``s.token_view(rollout_id)``, ``s.group_view(group_id)``, ``s.fork_view(...)``,
``s.table()`` and ``s.app()`` return Panel components that render inline and stay
interactive; the first of them sets up ``pn.extension`` with every resource inline, so a
notebook renders with no network. ``s.save_html(path, rollout=...)`` writes one
self-contained HTML file (no server, hover cards kept).

Every component made by one :class:`Studio` shares its session state (:attr:`Studio.state`),
as the views of one browser page do: picking a row in ``s.table()`` shows that rollout in
every ``s.token_view()`` made without an id. A view made for a given id has its own state.
"""
from __future__ import annotations

import dataclasses
import numbers
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
import pandas as pd

from studio import queries
from studio.errors import StudioError
from studio.store import Store, StoreError, default_db_path
from studio.workers.sync import run_sync

if TYPE_CHECKING:  # Panel is imported only when a component is asked for
    import panel as pn

    from studio.curation.export import ExportResult
    from studio.ingest.importers import ImportReport
    from studio.rewards.rules import ApplyResult
    from studio.runs.generation import GenerateResult

CHANNELS = ("entropy", "logprob", "advantage", "weight")


class StudioAPIError(StudioError, ValueError):
    """An API call was given something it cannot use; the message says what and why."""


def open(db: str | Path | None = None, policy: str | Path | None = None, *, create: bool = False) -> "Studio":
    """Open a studio store.

    Args:
        db: a store file; ``None`` is the embedded default (created and seeded with the
            sample rollouts on first use, as ``python launch.py`` does); ``":memory:"`` an
            empty store in memory.
        policy: the policy folder (or backend URL) that :meth:`Studio.generate` samples and
            :meth:`Studio.enrich` scores with; default the sample policy.
        create: make an empty store at ``db`` when there is none (default: refuse, so a
            mistyped path does not silently give an empty store).

    Raises:
        StoreError: no store at ``db`` (without ``create``), not a studio store, or the file
            is held by another process (DuckDB lets one process open a file at a time: a
            running ``launch.py`` on the same file must be stopped first).
    """
    from sample_data import POLICY_DIR, ROLLOUTS_DIR

    _path("db", db, optional=True)
    _path("policy", policy, optional=True)
    if not isinstance(create, bool):
        raise StudioAPIError(f"create must be True or False, got {_short(create)}")
    if db is None:
        store = Store.open(default_db_path(), seed_dir=ROLLOUTS_DIR)
    elif str(db) == ":memory:" or create:
        store = Store.open(db)
    else:
        try:
            exists = Path(db).expanduser().exists()
        except RuntimeError as exc:  # "~user/..." for a user that does not exist
            raise StoreError(f"cannot open {db}: {exc}") from None
        if not exists:
            raise StoreError(f"there is no studio store at {db}; studio.open({str(db)!r}, create=True) makes an "
                             "empty one, studio.open() opens the embedded default")
        store = Store.open(db)
    return Studio(store, policy or POLICY_DIR)


class Studio:
    """One store and one policy, with the studio's queries, actions and views as methods."""

    def __init__(self, store: Store, policy: str | Path):
        self.store = store
        self.policy = str(policy)
        self._state = None

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Close the store (another process may then open its file)."""
        self.store.close()

    def __enter__(self) -> "Studio":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        c = self.store.counts()
        return (f"<Studio {self.store.path}: {c['rollouts']:,} rollouts, {c['tokens']:,} tokens, "
                f"{c['runs']} runs; policy {Path(self.policy).name if '://' not in self.policy else self.policy}>")

    # -- reading -------------------------------------------------------------------------
    def runs(self) -> pd.DataFrame:
        """Every run (generate, mini-run, import, …) with its rollout count, newest first."""
        return queries.runs(self.store)

    def rollouts(self, run: str | None = None, prompt: str | None = None, correct: bool | None = None,
                 reward: tuple[float | None, float | None] | None = None, group: str | None = None,
                 step: int | None = None, rule_version: str | None = None, estimator: str = "grpo",
                 limit: int = 1000, offset: int = 0) -> pd.DataFrame:
        """Rollouts as the table shows them: prompt, completion, reward, advantage, accuracy,
        length, run, … Filters run in DuckDB, one page of ``limit`` rows from ``offset``.

        Args:
            run: a run id (see :meth:`runs`).
            prompt: keep prompts containing this text (case-insensitive).
            correct: True / False keeps correct / incorrect rollouts only.
            reward: ``(low, high)``, either end None for open.
            group: one group's completions.
            step: one training step's rollouts (mini-runs, imports).
            rule_version: whose rewards (default: each rollout's most recent scoring).
            estimator: the advantage column's estimator (``studio.signals.advantages.ESTIMATORS``).

        Raises:
            StudioAPIError: an argument of the wrong type or out of range, or an unknown
                ``rule_version``; the message names the argument.
        """
        from studio.signals.advantages import ESTIMATORS, Credit

        if not isinstance(estimator, str) or estimator not in ESTIMATORS:
            raise StudioAPIError(f"unknown estimator {_short(estimator)}; one of {', '.join(ESTIMATORS)}")
        for name, value in (("run", run), ("prompt", prompt), ("group", group)):
            _text(name, value)
        if correct is not None and not isinstance(correct, (bool, np.bool_)):
            raise StudioAPIError(f"correct must be True, False or None, got {_short(correct)}")
        if reward is None:
            lo = hi = None
        elif isinstance(reward, (tuple, list)) and len(reward) == 2:
            lo, hi = _number("reward's low end", reward[0]), _number("reward's high end", reward[1])
        else:
            raise StudioAPIError(f"reward must be (low, high), either end None for open, got {_short(reward)}")
        if step is not None:
            step = _whole("step", step, -_INT64, _INT64)
        limit, offset = _whole("limit", limit, 1, _INT64), _whole("offset", offset, 0, _INT64)
        if limit + offset > _INT64:
            raise StudioAPIError(f"limit + offset must be at most {_INT64}, got limit={limit}, offset={offset}")
        self._check_version(rule_version)
        f = queries.RolloutFilter(run_id=run, prompt_contains=prompt, correct=None if correct is None else bool(correct),
                                  reward_min=lo, reward_max=hi, group_id=group, train_step=step, limit=limit)
        return queries.rollout_table(self.store, f, rule_version, Credit(estimator=estimator), offset=offset)

    def rollout(self, rollout_id: str, rule_version: str | None = None) -> dict:
        """One rollout: prompt, completion, reward, advantage and reward components."""
        _text("rollout_id", rollout_id, optional=False)
        self._check_version(rule_version)
        ro = queries.rollout(self.store, rollout_id, rule_version)
        if ro is None:
            raise StudioAPIError(f"no rollout {rollout_id!r} in {self.store.path}")
        return ro

    def tokens(self, rollout_id: str) -> pd.DataFrame:
        """A rollout's tokens: id, text, log-prob, entropy, top-k ids and log-probs, one row each."""
        self.rollout(rollout_id)
        return queries.tokens(self.store, rollout_id)

    def groups(self, run: str | None = None) -> pd.DataFrame:
        """One row per group: prompt, size, mean reward, accuracy, and whether all rewards are equal."""
        return queries.groups(self.store, _text("run", run))

    def group(self, group_id: str) -> pd.DataFrame:
        """A group's completions with reward, advantage and every reward component as a column."""
        df = queries.group(self.store, self._group_id(group_id))
        return df

    def sql(self, query: str) -> pd.DataFrame:
        """Run one read-only SELECT (checked as the SQL tab checks it) and return its rows."""
        import duckdb

        from studio.queries.console import run

        _text("query", query, optional=False)
        try:
            return run(self.store, query).frame
        except duckdb.Error as exc:  # checked as read-only, then rejected by DuckDB (unknown column, bad cast...)
            raise StudioAPIError(f"DuckDB could not run the query: {str(exc).splitlines()[0]}") from None

    # -- actions (the UI's code paths) ---------------------------------------------------
    def generate(self, prompts: str | Iterable[str], *, group_size: int = 8, temperature: float = 1.0,
                 top_p: float = 1.0, max_new_tokens: int = 48, seed: int = 0, top_k_stats: int = 5,
                 task: str = "arithmetic", name: str | None = None, policy: str | Path | None = None,
                 progress: bool = False) -> "GenerateResult":
        """Sample ``group_size`` completions per prompt in the worker, score and store them, as
        the Generate panel does (then score them with the active rule version too).

        Raises:
            TaskParseError, ConfigError, PolicyLoadError: bad prompts, settings or policy;
                nothing is written.
        """
        from studio.runs.generation import GenerateConfig, generate

        texts = _texts("prompts", prompts)
        config = GenerateConfig(group_size=group_size, temperature=temperature, top_p=top_p,
                                max_new_tokens=max_new_tokens, seed=seed, top_k_stats=top_k_stats)

        def report(done: int, total: int, msg: str) -> None:
            print(f"\r{msg}", end="" if done < total else "\n", flush=True)

        return self._store_run(generate(self.store, policy or self.policy, texts, config, task=task, name=name,
                                        on_progress=report if progress else None))

    def branch(self, rollout_id: str, pos: int, choices: Iterable[int | None] = (None,), *, n: int = 4,
               temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
               policy: str | Path | None = None):
        """Branch a rollout at token ``pos``: keep its tokens before ``pos``, force each of
        ``choices`` (a token id, or None to draw as sampling would) and sample ``n``
        continuations each, scored and stored as the fork panel's *Branch* does.

        Raises:
            BranchError: a bad position, choice or policy; nothing is written.
        """
        from studio.runs.branch import BranchConfig, branch

        config = BranchConfig(n=n, temperature=temperature, top_p=top_p, seed=seed)

        return self._store_run(branch(self.store, rollout_id, int(pos), list(choices), config, policy or self.policy))

    def _store_run(self, making):
        """Await the coroutine ``making`` (a Generate or Branch that stores a run), then score
        the new run with the active rule version too, as the panels do; views reload."""
        from studio.rewards.rules import score_new_run

        async def go():
            res = await making
            if res.rollouts:
                await score_new_run(self.store, res.run_id)
            return res

        res = run_sync(go)
        self._refresh()
        return res

    def score(self, rule: str | Path | None = None, *, reward_model: str | Path | None = None,
              name: str | None = None, note: str = "", run: str | None = None) -> "ApplyResult":
        """Re-score stored rollouts with a reward rule (in the sandbox) or a reward model, and
        store the result as a new rule version, as the Reward rules tab does.

        Args:
            rule: the rule's source (text defining ``reward(prompt, completion, gold, steps, **ctx)``),
                a ``.py`` file, or a dotted module path.
            reward_model: instead of a rule, a sequence-classification reward-model folder.
            run: only this run's rollouts (default: every rollout).
        """
        from studio.rewards import reward_models, rules

        if (rule is None) == (reward_model is None):
            raise StudioAPIError("give a rule (source, .py file or module) or reward_model=FOLDER, not both")
        if rule is not None and not isinstance(rule, (str, os.PathLike)):
            raise StudioAPIError(f"rule must be its source text, a .py file or a dotted module path, got "
                                 f"{type(rule).__name__} {_short(rule)}")
        _path("reward_model", reward_model, optional=True)
        _text("name", name)
        _text("note", note, optional=False)
        if _text("run", run) and self.store.scalar("SELECT count(*) FROM runs WHERE run_id = ?", [run]) == 0:
            raise StudioAPIError(f"no run {run!r} in {self.store.path}; Studio.runs() lists them")
        scope = queries.RolloutFilter(run_id=run) if run else None
        if reward_model is not None:
            res = reward_models.score_with_reward_model_sync(self.store, reward_model, scope)
        else:
            spec = str(rule)
            source = spec if "def reward" in spec else rules.load_source(spec)
            default = "rule" if "def reward" in spec else (Path(spec).stem if spec.endswith(".py") else spec.rsplit(".", 1)[-1])
            res = rules.apply_rule_sync(self.store, source, name or default, note, scope=scope)
        self._refresh()
        return res

    def import_run(self, paths: str | Path | list, format: str | None = None, *, mapping: dict | None = None,
                   skip_bad: bool = False, name: str | None = None, task: str = "import") -> "ImportReport":
        """Import a training run's rollouts (TRL, verl, OpenRLHF, or JSONL / Parquet with a
        ``mapping`` of field → column), in one transaction, as the Import tab does.

        Raises:
            MalformedInput: bad records and ``skip_bad`` is False (nothing written; ``.problems``
                names each ``file:line``).
            ImportFormatError: the files are not what the format expects.
        """
        from studio.ingest.importers import ColumnMapping, import_run

        cm = ColumnMapping(**mapping) if mapping else None
        rep = import_run(self.store, paths, format, mapping=cm, on_error="skip" if skip_bad else "abort",
                         name=name, task=task)
        self._refresh()
        return rep

    def enrich(self, run: str | None = None, policy: str | Path | None = None):
        """Fill in what imported rollouts lack (token ids, log-probs, entropy, top-k) by
        teacher-forcing ``policy`` (default this studio's) over them, in the worker."""
        from studio.runs.enrich import enrich_sync

        rep = enrich_sync(self.store, policy or self.policy, run_id=run)
        self._refresh()
        return rep

    def build_pairs(self, run: str | Iterable[str] | None = None, **rule: Any):
        """Make preference pairs with a :class:`studio.curation.pairs.PairRule` (its fields as keyword
        arguments), stored as pending for review, as the Preference data tab does."""
        from studio.curation.pairs import PairRule, build_pairs

        names = {f.name for f in dataclasses.fields(PairRule)}
        unknown = sorted(set(rule) - names)
        if unknown:
            raise StudioAPIError(f"unknown pair rule fields {unknown}; PairRule has {sorted(names)}")
        for f in dataclasses.fields(PairRule):
            if f.name in rule:
                _typed(f.name, rule[f.name], str(f.type))
        runs = None if run is None else _texts("run", run)
        if runs == []:
            raise StudioAPIError("run must name at least one run id (or be None for every run)")
        missing = [r for r in runs or [] if not self.store.scalar("SELECT count(*) FROM runs WHERE run_id = ?", [r])]
        if missing:
            raise StudioAPIError(f"no run {', '.join(map(repr, missing))} in {self.store.path}; Studio.runs() lists them")
        res = build_pairs(self.store, PairRule(**rule), run_ids=runs)
        self._refresh()
        return res

    def accept(self, pairs: Iterable[str] | None = None, *, build: str | None = None) -> int:
        """Accept pairs (by id, or every pending pair of a build); returns how many."""
        from studio.curation.pairs import decide

        ids = None if pairs is None else _texts("pairs", pairs)
        if not ids and not _text("build", build):
            raise StudioAPIError("give pair ids or build=BUILD_ID")
        return decide(self.store, "accepted", ids or None, build_id=build)

    def export(self, path: str | Path, format: str = "preference", style: str = "standard",
               **options: Any) -> "ExportResult":
        """Write the accepted pairs in a TRL dataset format (``.jsonl``, ``.parquet``, or a
        ``datasets`` folder) with a provenance sidecar, as the Preference data tab does.

        ``options`` are :func:`studio.curation.export.export`'s: ``overwrite``, ``skip_stale``,
        ``build_id``, ``kinds``, ``step_source``, ….
        """
        import inspect

        from studio.curation.export import export

        _path("path", path)
        _text("format", format, optional=False)
        _text("style", style, optional=False)
        known = {n: p.annotation for n, p in inspect.signature(export).parameters.items() if not n.startswith("_")}
        unknown = sorted(set(options) - set(list(known)[4:]))
        if unknown:
            raise StudioAPIError(f"unknown export options {unknown}; export takes {list(known)[4:]}")
        for k, v in options.items():
            _typed(k, v, str(known[k]))
        return export(self.store, path, format, style, **options)

    # -- views (Panel components) --------------------------------------------------------
    @property
    def state(self):
        """The session state every component of this studio shares (a ``StudioState``)."""
        if self._state is None:
            self._state = self._new_state()
        return self._state

    def _new_state(self, **values):
        setup_notebook()
        from widgets.state import StudioState

        return StudioState(store=self.store, policy_path=self.policy, **values)

    def _refresh(self) -> None:
        if self._state is not None:
            self._state.refresh += 1

    def _group_id(self, key: str) -> str:
        """A group id as given, or the newest group of a prompt id."""
        _text("group", key, optional=False)
        gid = self.store.scalar("SELECT group_id FROM rollouts WHERE group_id = ? LIMIT 1", [key])
        if gid is None:
            gid = self.store.scalar("SELECT group_id FROM rollouts WHERE prompt_id = ? "
                                    "ORDER BY created_at DESC, rollout_id DESC LIMIT 1", [key])
        if gid is None:
            raise StudioAPIError(f"{key!r} is neither a group id nor a prompt id in {self.store.path}")
        return gid

    def _check_version(self, rule_version: str | None) -> None:
        """A clear error for a rule version that is not a string or not in the store."""
        if _text("rule_version", rule_version) is not None and self.store.scalar(
                "SELECT count(*) FROM rule_versions WHERE rule_version_id = ?", [rule_version]) == 0:
            raise StudioAPIError(f"no rule version {rule_version!r} in {self.store.path}; "
                                 "studio.rewards.rules.versions(s.store) lists them")

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

    def token_view(self, rollout_id: str | None = None, channel: str = "entropy") -> "pn.viewable.Viewable":
        """A rollout's token strip with its colour-channel picker and hover cards. Without an
        id it follows the rollout picked in :meth:`table` (or :attr:`state`)."""
        import panel as pn

        from widgets.style import CSS
        from widgets.token_strip import TokenStrip

        _check_channel(channel)
        st = self._view_state(rollout_id, channel=channel)
        picker = pn.widgets.RadioButtonGroup.from_param(st.param.channel, name="Colour tokens by", color="light",
                                                        css_classes=["channel-picker"])
        # room below the strip for the hover card: a notebook's output area clips what overflows it
        return pn.Column(picker, TokenStrip(state=st), sizing_mode="stretch_width", stylesheets=[CSS],
                         css_classes=["studio-token-view"], styles={"padding-bottom": "170px"})

    def group_view(self, group: str | None = None) -> "pn.viewable.Viewable":
        """All completions of one group (a group id, or a prompt id: its newest group) side by
        side with rewards and advantages; without an argument it follows :attr:`state`."""
        from widgets.group_view import GroupView

        st = self._view_state(group_id=self._group_id(group) if group else None)
        return GroupView(state=st)

    def fork_view(self, rollout_id: str | None = None) -> "pn.viewable.Viewable":
        """A rollout's fork panel: alternatives at the picked token, Branch, and its rollout tree."""
        from widgets.fork_panel import ForkPanel

        return ForkPanel(state=self._view_state(rollout_id))

    def table(self, run: str | None = None) -> "pn.viewable.Viewable":
        """The rollout table with its filters; picking a row opens it in the shared state's views."""
        import panel as pn

        from widgets.rollout_table import RolloutTable

        st = self.state
        if run:
            st.jump_run = run
        t = RolloutTable(state=st)
        return pn.Row(pn.Column(t.controls, width=300), t, sizing_mode="stretch_width")

    def explorer(self) -> "pn.viewable.Viewable":
        """Table, token strip and group view of the shared state together: a small studio."""
        import panel as pn

        return pn.Column(self.table(), pn.Row(self.token_view(), self.fork_view(), sizing_mode="stretch_width"),
                         self.group_view(), sizing_mode="stretch_width")

    def view(self, name: str) -> "pn.viewable.Viewable":
        """One of the studio's tabs as a component on the shared state, by its tab name:
        ``"entropy landscape"``, ``"compare policies"``, ``"reward rules"``, ``"reward hacking"``,
        ``"advantages & steps"``, ``"mini-runs"``, ``"preference data"``, ``"timeline & diff"``,
        ``"import & enrich"``, ``"sql"`` (see :data:`VIEWS`)."""
        import importlib

        key = _text("name", name, optional=False).strip().lower()
        if key not in VIEWS:
            raise StudioAPIError(f"no view {name!r}; one of {', '.join(VIEWS)}")
        module, cls, kwargs = VIEWS[key]
        st = self.state
        if not kwargs.get("shown"):
            return getattr(importlib.import_module(f"widgets.{module}"), cls)(state=st, **kwargs)
        view = getattr(importlib.import_module(f"widgets.{module}"), cls)(state=st, **{**kwargs, "shown": False})
        view.shown = True  # drawn now, as a tab is when it is opened
        return view

    def app(self) -> "pn.viewable.Viewable":
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

        _path("path", path)
        for k, v in (("rollout", rollout), ("group", group), ("fork_tree", fork_tree), ("title", title)):
            _text(k, v)
        given = [k for k, v in (("rollout", rollout), ("group", group), ("fork_tree", fork_tree)) if v]
        if len(given) != 1:
            raise StudioAPIError("give exactly one of rollout=, group=, fork_tree=")
        _check_channel(channel)
        return save_html(self, Path(path), rollout=rollout, group=self._group_id(group) if group else None,
                         fork_tree=fork_tree, channel=channel, title=title)


# tab name -> (widgets module, class, arguments): every tab of the served page as a component
VIEWS: dict[str, tuple[str, str, dict]] = {
    "entropy landscape": ("entropy_view", "EntropyLandscape", {"shown": True}),
    "compare policies": ("entropy_view", "PolicyCompare", {"shown": True}),
    "reward rules": ("rule_panel", "RulePanel", {"shown": True}),
    "reward hacking": ("hacking_view", "HackingView", {"shown": True}),
    "advantages & steps": ("credit_panel", "CreditView", {"shown": True}),
    "mini-runs": ("minirun_panel", "MiniRunPanel", {"shown": True}),
    "preference data": ("curation_panel", "CurationPanel", {"shown": True}),
    "timeline & diff": ("timeline_panel", "TimelinePanel", {"shown": True}),
    "import & enrich": ("import_panel", "ImportPanel", {}),
    "sql": ("sql_console", "SQLConsole", {}),
}


def _check_channel(channel: str) -> None:
    if not isinstance(channel, str) or channel not in CHANNELS:
        raise StudioAPIError(f"unknown channel {channel!r}; one of {', '.join(CHANNELS)}")


# -- argument checks: a wrong type or value is a StudioAPIError naming the argument, never a
# TypeError or a DuckDB conversion error from deep inside a query
_INT64 = 2**63 - 1


def _short(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= 80 else r[:77] + "..."


def _text(name: str, value: Any, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise StudioAPIError(f"{name} must be a string{' or None' if optional else ''}, got "
                             f"{type(value).__name__} {_short(value)}")
    return value


def _texts(name: str, value: Any) -> list[str]:
    """One string, or an iterable of strings, as a list."""
    if isinstance(value, str):
        return [value]
    try:
        items = None if isinstance(value, (bytes, bytearray)) else list(value)
    except TypeError:
        items = None
    if items is None or not all(isinstance(x, str) for x in items):
        raise StudioAPIError(f"{name} must be a string or a list of strings, got {_short(value)}")
    return items


def _path(name: str, value: Any, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, (str, os.PathLike)) or "\x00" in str(value):
        raise StudioAPIError(f"{name} must be a path (a string or pathlib.Path without NUL characters), got "
                             f"{type(value).__name__} {_short(value)}")


def _whole(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise StudioAPIError(f"{name} must be a whole number, got {type(value).__name__} {_short(value)}")
    if not lo <= value <= hi:
        raise StudioAPIError(f"{name} must be between {lo} and {hi}, got {value}")
    return int(value)


def _number(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or value != value:
        raise StudioAPIError(f"{name} must be a number or None, got {_short(value)}")
    return float(value)


def _typed(name: str, value: Any, annotation: str) -> None:
    """``value`` against a dataclass field's annotation (``str``, ``bool``, ``int | None``, ``float``...)."""
    if value is None and "None" in annotation:
        return
    if annotation.startswith("str"):
        _text(name, value, optional=False)
    elif annotation.startswith("bool"):
        if not isinstance(value, (bool, np.bool_)):
            raise StudioAPIError(f"{name} must be True or False, got {_short(value)}")
    elif annotation.startswith("int"):
        _whole(name, value, -_INT64, _INT64)
    elif annotation.startswith("float"):
        _number(name, value)
    elif annotation.startswith("Iterable[str]"):
        _texts(name, value)


def setup_notebook() -> None:
    """Set up Panel for notebooks, offline: every resource inline (``widgets.notebook.setup``)."""
    from widgets.notebook import setup

    setup()
