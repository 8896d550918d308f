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
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from studio import queries
from studio.face.checks import (
    INT64,
    StudioAPIError,
    arg_number,
    arg_path,
    arg_text,
    arg_texts,
    arg_typed,
    arg_whole,
    short,
)
from studio.face.views import StudioViews
from studio.store import Store, StoreError, default_db_path
from studio.store import exists as store_exists
from studio.tasks import Prompt
from studio.workers.sync import run_sync

if TYPE_CHECKING:
    from studio.curation.writer import ExportResult
    from studio.ingest.importers import ImportReport
    from studio.rewards.rules import ApplyResult
    from studio.runs.generation import GenerateResult

def open(db: str | Path | None = None, policy: str | Path | None = None, *, create: bool = False) -> Studio:
    """Open a studio store.

    Args:
        db: a store file, a shared store's folder or a team catalog's ``postgresql://`` URL
            (``docs/shared-store.md``); ``None`` is the embedded default (created and seeded with the
            sample rollouts on first use, as ``python launch.py`` does); ``":memory:"`` an
            empty store in memory.
        policy: the policy folder (or backend URL) that :meth:`Studio.generate` samples and
            :meth:`Studio.enrich` scores with; default the sample policy.
        create: make an empty store at ``db`` when there is none (default: refuse, so a
            mistyped path does not silently give an empty store).

    Raises:
        StoreError: no store at ``db`` (without ``create``), not a studio store, or the file
            is held by another process (a store *file* opens in one process at a time: a running
            ``launch.py`` on the same file must be stopped first; a shared store has no such limit).
    """
    from sample_data import POLICY_DIR, SEED_DIRS

    arg_path("db", db, optional=True)
    arg_path("policy", policy, optional=True)
    if not isinstance(create, bool):
        raise StudioAPIError(f"create must be True or False, got {short(create)}")
    if db is None:
        store = Store.open(default_db_path(), seed_dir=SEED_DIRS)
    elif str(db) == ":memory:" or create:
        store = Store.open(db)
    else:
        if not store_exists(db):
            raise StoreError(f"there is no studio store at {db}; studio.open({str(db)!r}, create=True) makes an "
                             "empty one, studio.open() opens the embedded default")
        store = Store.open(db)
    return Studio(store, policy or POLICY_DIR)


class Studio(StudioViews):
    """One store and one policy, with the studio's queries, actions and views as methods."""

    def __init__(self, store: Store, policy: str | Path):
        self.store = store
        self.policy = str(policy)
        self._state = None

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Close the store (another process may then open its file)."""
        self.store.close()

    def __enter__(self) -> Studio:
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
                 limit: int = 1000, offset: int = 0, min_turns: int | None = None, tool: str | None = None,
                 tool_errors: bool | None = None) -> pd.DataFrame:
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
            min_turns: agent trajectories of at least this many turns (a single answer is one).
            tool: trajectories that called this tool.
            tool_errors: True / False keeps trajectories with at least one failed tool call / none.

        Raises:
            StudioAPIError: an argument of the wrong type or out of range, or an unknown
                ``rule_version``; the message names the argument.
        """
        from studio.signals.advantages import ESTIMATORS, Credit

        if not isinstance(estimator, str) or estimator not in ESTIMATORS:
            raise StudioAPIError(f"unknown estimator {short(estimator)}; one of {', '.join(ESTIMATORS)}")
        for name, value in (("run", run), ("prompt", prompt), ("group", group), ("tool", tool)):
            arg_text(name, value)
        for name, value in (("correct", correct), ("tool_errors", tool_errors)):
            if value is not None and not isinstance(value, (bool, np.bool_)):
                raise StudioAPIError(f"{name} must be True, False or None, got {short(value)}")
        if min_turns is not None:
            min_turns = arg_whole("min_turns", min_turns, 1, INT64)
        if reward is None:
            lo = hi = None
        elif isinstance(reward, (tuple, list)) and len(reward) == 2:
            lo, hi = arg_number("reward's low end", reward[0]), arg_number("reward's high end", reward[1])
        else:
            raise StudioAPIError(f"reward must be (low, high), either end None for open, got {short(reward)}")
        if step is not None:
            step = arg_whole("step", step, -INT64, INT64)
        limit, offset = arg_whole("limit", limit, 1, INT64), arg_whole("offset", offset, 0, INT64)
        if limit + offset > INT64:
            raise StudioAPIError(f"limit + offset must be at most {INT64}, got limit={limit}, offset={offset}")
        self._check_version(rule_version)
        f = queries.RolloutFilter(run_id=run, prompt_contains=prompt,
                                  correct=None if correct is None else bool(correct), reward_min=lo, reward_max=hi,
                                  group_id=group, train_step=step, min_turns=min_turns, tool=tool,
                                  tool_errors=None if tool_errors is None else bool(tool_errors), limit=limit)
        return queries.rollout_table(self.store, f, rule_version, Credit(estimator=estimator), offset=offset)

    def rollout(self, rollout_id: str, rule_version: str | None = None) -> dict:
        """One rollout: prompt, completion, reward, advantage and reward components."""
        arg_text("rollout_id", rollout_id, optional=False)
        self._check_version(rule_version)
        ro = queries.rollout(self.store, rollout_id, rule_version)
        if ro is None:
            raise StudioAPIError(f"no rollout {rollout_id!r} in {self.store.path}")
        return ro

    def tokens(self, rollout_id: str) -> pd.DataFrame:
        """A rollout's tokens: id, text, log-prob, entropy, top-k ids and log-probs, one row each."""
        self.rollout(rollout_id)
        return queries.tokens(self.store, rollout_id)

    def mismatch(self, run: str | None = None, rollouts: Iterable[str] | None = None, source: str = "",
                 correction: str | None = None) -> pd.DataFrame:
        """Training–inference mismatch per rollout (of a run, some rollouts, or the store): ``n``
        tokens with Δ = train − behaviour log-prob, ``delta_sum``, ``delta_mean``, ``geo_ratio``,
        ``max_abs_delta``, mean ``k1``/``k2``/``k3`` and ``rejected`` under ``correction`` (a preset
        name of ``studio.signals.mismatch.PRESETS``). ``source``: ``""`` the stored recomputed
        log-prob, else a rescoring's policy version (``queries.mismatch.sources``)."""
        from studio.queries import mismatch
        from studio.signals.mismatch import PRESETS

        arg_text("run", run)
        if correction is not None and correction not in PRESETS:
            raise StudioAPIError(f"unknown correction {short(correction)}; one of {', '.join(PRESETS)}")
        if source and source not in mismatch.sources(self.store):
            raise StudioAPIError(f"no rescoring {short(source)} in {self.store.path}; "
                                 f"one of {', '.join(mismatch.sources(self.store)) or 'none'}")
        scope = [str(r) for r in rollouts] if rollouts is not None else queries.RolloutFilter(run_id=run)
        return mismatch.sequence_summaries(self.store, scope, source,
                                           PRESETS[correction] if correction else None)

    def mismatch_tokens(self, rollout_id: str, source: str = "") -> pd.DataFrame:
        """One rollout's tokens with both log-probs, Δ, ratio, k3, the rank under each side and entropy."""
        from studio.queries import mismatch

        self.rollout(rollout_id)
        return mismatch.rollout_mismatch(self.store, rollout_id, source)

    def groups(self, run: str | None = None) -> pd.DataFrame:
        """One row per group: prompt, size, mean reward, accuracy, and whether all rewards are equal."""
        return queries.groups(self.store, arg_text("run", run))

    def group(self, group_id: str) -> pd.DataFrame:
        """A group's completions with reward, advantage and every reward component as a column."""
        df = queries.group(self.store, self._group_id(group_id))
        return df

    def sql(self, query: str) -> pd.DataFrame:
        """Run one read-only SELECT (checked as the SQL tab checks it) and return its rows."""
        import duckdb

        from studio.queries.console import run

        arg_text("query", query, optional=False)
        try:
            return run(self.store, query).frame
        except duckdb.Error as exc:  # checked as read-only, then rejected by DuckDB (unknown column, bad cast...)
            raise StudioAPIError(f"DuckDB could not run the query: {str(exc).splitlines()[0]}") from None

    # -- actions (the UI's code paths) ---------------------------------------------------
    def generate(self, prompts: str | Iterable[str] | Iterable[Prompt] = (), *, group_size: int = 8,
                 temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 48, seed: int = 0,
                 top_k_stats: int = 5, max_turns: int = 8, task: str = "arithmetic", draw: int = 0,
                 split: str | None = None, name: str | None = None, policy: str | Path | None = None,
                 progress: bool = False) -> GenerateResult:
        """Sample ``group_size`` completions per prompt in the worker, score and store them, as
        the Generate panel does (then score them with the active rule version too).

        ``prompts`` are typed texts of ``task`` or prompts drawn from the store
        (:meth:`draw_prompts`); ``draw=N`` adds N prompts drawn from the task (a stored prompt
        set's ``split``; the sample task's generator), seeded by ``seed``. A chat prompt is
        rendered with the policy's chat template. On a task with tools (``calculator_agent``) every
        completion is an agent trajectory of up to ``max_turns`` tool calls.

        Raises:
            TaskParseError, ConfigError, PolicyLoadError, UnknownTaskError: bad prompts, task,
                settings or policy; nothing is written.
        """
        from studio.queries.prompts import draw_prompts
        from studio.runs.generation import GenerateConfig, generate

        if isinstance(prompts, (str, Prompt)):
            items = [prompts]
        else:
            try:
                items = list(prompts) if not isinstance(prompts, (bytes, bytearray)) else None
            except TypeError:
                items = None
            if items is None:
                arg_texts("prompts", prompts)  # raises the API's error for a value that is not prompts
        texts: list = [p if isinstance(p, Prompt) else arg_texts("prompts", p)[0] for p in items]
        if draw:
            texts += draw_prompts(self.store, task, int(draw), seed=seed, split=split)
        config = GenerateConfig(group_size=group_size, temperature=temperature, top_p=top_p,
                                max_new_tokens=max_new_tokens, seed=seed, top_k_stats=top_k_stats, max_turns=max_turns)

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
              name: str | None = None, note: str = "", run: str | None = None) -> ApplyResult:
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
                                 f"{type(rule).__name__} {short(rule)}")
        arg_path("reward_model", reward_model, optional=True)
        arg_text("name", name)
        arg_text("note", note, optional=False)
        if arg_text("run", run) and self.store.scalar("SELECT count(*) FROM runs WHERE run_id = ?", [run]) == 0:
            raise StudioAPIError(f"no run {run!r} in {self.store.path}; Studio.runs() lists them")
        scope = queries.RolloutFilter(run_id=run) if run else None
        if reward_model is not None:
            res = reward_models.score_with_reward_model_sync(self.store, reward_model, scope)
        else:
            spec = str(rule)
            source = spec if "def reward" in spec else rules.load_source(spec)
            default = "rule" if "def reward" in spec else (
                Path(spec).stem if spec.endswith(".py") else spec.rsplit(".", 1)[-1])
            res = rules.apply_rule_sync(self.store, source, name or default, note, scope=scope)
        self._refresh()
        return res

    def import_run(self, paths: str | Path | list, format: str | None = None, *, mapping: dict | None = None,
                   skip_bad: bool = False, name: str | None = None, task: str = "import") -> ImportReport:
        """Import a training run's rollouts (TRL, verl, OpenRLHF, or JSONL / Parquet with a
        ``mapping`` of field → column), in one transaction, as the Import tab does.

        Raises:
            MalformedInput: bad records and ``skip_bad`` is False (nothing written; ``.problems``
                names each ``file:line``).
            ImportFormatError: the files are not what the format expects.
        """
        from studio.ingest.formats import ColumnMapping
        from studio.ingest.importers import import_run

        cm = ColumnMapping(**mapping) if mapping else None
        rep = import_run(self.store, paths, format, mapping=cm, on_error="skip" if skip_bad else "abort",
                         name=name, task=task)
        self._refresh()
        return rep

    def add_prompt_set(self, paths: str | Path | list, **settings: Any):
        """Store a prompt set (JSONL, JSON, Parquet, CSV files, or ``datasets`` folders) as a task,
        as ``rollout-studio task add`` does: ``name`` and the other settings of
        :class:`studio.ingest.prompt_sets.PromptSetConfig` as keyword arguments
        (``s.add_prompt_set("gsm8k/train.jsonl", name="gsm8k")``). Returns the ``TaskReport``.

        Raises:
            PromptSetError: a file, row, column or setting that cannot be used (it names which);
                nothing is stored then.
        """
        from studio.ingest.prompt_sets import add_prompt_set, config_from

        rep = add_prompt_set(self.store, paths, config_from(settings))
        self._refresh()
        return rep

    def tasks(self) -> pd.DataFrame:
        """The tasks this store defines (name, kind, source, n_prompts, splits with counts, created_at)."""
        from studio.queries.prompts import stored_tasks

        return stored_tasks(self.store)

    def draw_prompts(self, task: str, n: int, seed: int = 0, split: str | None = None, level: str | None = None):
        """``n`` prompts of ``task`` drawn deterministically from ``seed`` (of ``split`` / ``level`` when
        given), as ``studio.tasks.Prompt`` objects; a built-in task (arithmetic) makes them."""
        from studio.queries.prompts import draw_prompts

        return draw_prompts(self.store, task, n, seed=seed, split=split, level=level)

    def enrich(self, run: str | None = None, policy: str | Path | None = None):
        """Fill in what imported rollouts lack (token ids, log-probs, entropy, top-k) by
        teacher-forcing ``policy`` (default this studio's) over them, in the worker."""
        from studio.runs.enrich import enrich_sync

        rep = enrich_sync(self.store, policy or self.policy, run_id=run)
        self._refresh()
        return rep

    def rescore(self, policy: str | Path, rollouts: Iterable[str] | None = None, run: str | None = None,
                precision: str = "float32"):
        """Teacher-force ``rollouts`` (or every rollout of ``run``) through ``policy`` at ``precision``:
        recomputed log-probs in token_scores, the first ones in tokens.train_logprob
        (``studio.runs.rescore``). Returns its ``RescoreReport``."""
        from studio.runs.rescore import rescore_sync

        if (rollouts is None) == (run is None):
            raise ValueError("rescore needs either rollouts or a run")
        ids = list(rollouts) if rollouts is not None else self.store.df(
            "SELECT rollout_id FROM rollouts WHERE run_id = ? ORDER BY rollout_id", [run])["rollout_id"].tolist()
        rep = rescore_sync(self.store, policy, ids, precision=precision)
        self._refresh()
        return rep

    def build_pairs(self, run: str | Iterable[str] | None = None, **rule: Any):
        """Make preference pairs with a :class:`studio.curation.rules.PairRule` (its fields as keyword
        arguments), stored as pending for review, as the Preference data tab does."""
        from studio.curation.build import build_pairs
        from studio.curation.rules import PairRule

        names = {f.name for f in dataclasses.fields(PairRule)}
        unknown = sorted(set(rule) - names)
        if unknown:
            raise StudioAPIError(f"unknown pair rule fields {unknown}; PairRule has {sorted(names)}")
        for f in dataclasses.fields(PairRule):
            if f.name in rule:
                arg_typed(f.name, rule[f.name], str(f.type))
        runs = None if run is None else arg_texts("run", run)
        if runs == []:
            raise StudioAPIError("run must name at least one run id (or be None for every run)")
        missing = [r for r in runs or [] if not self.store.scalar("SELECT count(*) FROM runs WHERE run_id = ?", [r])]
        if missing:
            raise StudioAPIError(f"no run {', '.join(map(repr, missing))} in {self.store.path}; "
                                 "Studio.runs() lists them")
        res = build_pairs(self.store, PairRule(**rule), run_ids=runs)
        self._refresh()
        return res

    def accept(self, pairs: Iterable[str] | None = None, *, build: str | None = None) -> int:
        """Accept pairs (by id, or every pending pair of a build); returns how many."""
        from studio.curation.review import decide

        ids = None if pairs is None else arg_texts("pairs", pairs)
        if not ids and not arg_text("build", build):
            raise StudioAPIError("give pair ids or build=BUILD_ID")
        return decide(self.store, "accepted", ids or None, build_id=build)

    def export(self, path: str | Path, format: str = "preference", style: str = "standard",
               **options: Any) -> ExportResult:
        """Write the accepted pairs in a TRL dataset format (``.jsonl``, ``.parquet``, or a
        ``datasets`` folder) with a provenance sidecar, as the Preference data tab does.

        ``options`` are :func:`studio.curation.writer.export`'s: ``overwrite``, ``skip_stale``,
        ``build_id``, ``kinds``, ``step_source``, ….
        """
        import inspect

        from studio.curation.writer import export

        arg_path("path", path)
        arg_text("format", format, optional=False)
        arg_text("style", style, optional=False)
        known = {n: p.annotation for n, p in inspect.signature(export).parameters.items() if not n.startswith("_")}
        unknown = sorted(set(options) - set(list(known)[4:]))
        if unknown:
            raise StudioAPIError(f"unknown export options {unknown}; export takes {list(known)[4:]}")
        for k, v in options.items():
            arg_typed(k, v, str(known[k]))
        return export(self.store, path, format, style, **options)

    def _group_id(self, key: str) -> str:
        """A group id as given, or the newest group of a prompt id."""
        arg_text("group", key, optional=False)
        gid = self.store.scalar("SELECT group_id FROM rollouts WHERE group_id = ? LIMIT 1", [key])
        if gid is None:
            gid = self.store.scalar("SELECT group_id FROM rollouts WHERE prompt_id = ? "
                                    "ORDER BY created_at DESC, rollout_id DESC LIMIT 1", [key])
        if gid is None:
            raise StudioAPIError(f"{key!r} is neither a group id nor a prompt id in {self.store.path}")
        return gid

    def _check_version(self, rule_version: str | None) -> None:
        """A clear error for a rule version that is not a string or not in the store."""
        if arg_text("rule_version", rule_version) is not None and self.store.scalar(
                "SELECT count(*) FROM rule_versions WHERE rule_version_id = ?", [rule_version]) == 0:
            raise StudioAPIError(f"no rule version {rule_version!r} in {self.store.path}; "
                                 "studio.rewards.rules.versions(s.store) lists them")
