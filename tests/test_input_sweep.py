"""Property-based sweep of the input boundaries ``tests/test_bad_input.py`` and
``tests/test_importers.py`` leave out: reward-rule sources, Python API arguments, CLI argv
and the served page's URL. Each either works or fails with a typed error whose message
names the problem, and a failure leaves every table of the store as it was (row count and
a hash of every row)."""
from __future__ import annotations

import contextlib
import gc
import io
import logging
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import studio
from backends import PolicyLoadError
from sample_data import POLICY_DIR, ROLLOUTS_DIR
from studio import queries
from studio.curation.errors import CurationError
from studio.curation.rules import PairRule
from studio.face import cli
from studio.face.api import Studio, StudioAPIError
from studio.queries.console import ReadOnlyError
from studio.rewards import rules
from studio.rewards.sandbox import Limits, RuleSourceError
from studio.runs.generation import ConfigError
from studio.store import QueryTimeout, Store, StoreError, schema
from studio.tasks import TaskParseError, get_task
from tests.ui.harness import server_tracebacks

SWEEP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])
FEW = settings(SWEEP, max_examples=10)
# short per-rollout limit: an endless loop costs 0.2 s a rollout here, not the default 2 s
FAST = Limits(call_s=0.2, budget_s=20)
GOOD_RULE = "def reward(prompt, completion, gold, steps, **ctx):\n    return float(len(completion) < 30)\n"
INJECTIONS = ["'; DROP TABLE rollouts; --", "' OR '1'='1", "%", "_", "\\", "'); DELETE FROM rewards; --",
              '" OR 1=1 --', "$1", "?", "\x00", "run_3 UNION SELECT * FROM runs", "../../etc/passwd", "é\u202e"]
# any value a caller might pass by mistake
WEIRD = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=30),
                  st.binary(max_size=8), st.lists(st.integers(), max_size=3), st.tuples(st.floats(), st.floats()),
                  st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.sampled_from(INJECTIONS))


# every table's row count and an order-free hash of its rows, in one query
FINGERPRINT = " UNION ALL ".join(f"SELECT '{t}' AS t, count(*) AS n, coalesce(bit_xor(hash(x)), 0) AS h FROM {t} x"
                                 for t in schema.TABLES)


def fingerprint(store: Store) -> list[tuple]:
    return sorted(store.df(FINGERPRINT).itertuples(index=False, name=None))


def file_fingerprint(path: Path) -> list[tuple]:
    """A store file's fingerprint, read-only (no process may hold the file)."""
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        return sorted(con.execute(FINGERPRINT).fetchall())
    finally:
        con.close()


@pytest.fixture(scope="module", autouse=True)
def default_store_elsewhere(tmp_path_factory):
    """The embedded default store must never be the user's (the CLI's --db default, studio.open())."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROLLOUT_STUDIO_DB", str(tmp_path_factory.mktemp("default") / "default.duckdb"))
        yield


@pytest.fixture(scope="module")
def s():
    """One seeded in-memory store for the module: the properties check it per example."""
    st_ = Studio(Store.open(":memory:", seed_dir=ROLLOUTS_DIR), POLICY_DIR)
    yield st_
    st_.close()


@pytest.fixture(scope="module")
def group(s) -> queries.RolloutFilter:
    """One group (8 rollouts): the scope rules are applied to here, to keep sandbox runs short."""
    return queries.RolloutFilter(group_id=s.store.scalar("SELECT group_id FROM rollouts ORDER BY rollout_id LIMIT 1"))


def apply(s: Studio, source: str, scope, limits: Limits = FAST, name: str = "fuzz") -> rules.ApplyResult:
    # chunk=2 spreads the group over the workers: a looping rule costs 4 x call_s, not 8 x
    return rules.apply_rule_sync(s.store, source, name, scope=scope, limits=limits, chunk=2)


def version_rows(s: Studio, vid: str) -> pd.DataFrame:
    return s.store.df("SELECT rollout_id, value, error FROM rewards WHERE rule_version_id = ? AND component = 'total'",
                      [vid])


# ============================================================================ rule sources

def mutated(source: str) -> st.SearchStrategy[str]:
    """``source`` with a slice replaced by arbitrary text: near misses of a working rule."""
    return st.tuples(st.integers(0, len(source)), st.integers(0, 12), st.text(max_size=8)).map(
        lambda t: source[:t[0]] + t[2] + source[t[0] + t[1]:])


@SWEEP
@given(source=st.one_of(st.text(max_size=200), mutated(rules.DEFAULT_SOURCE), mutated(GOOD_RULE)))
def test_any_rule_source_scores_or_is_refused_at_its_line(s, group, source):
    before = fingerprint(s.store)
    try:
        res = apply(s, source, group)
    except RuleSourceError as exc:
        n_lines = source.count("\n") + 1
        assert exc.problems and all(1 <= p.line <= n_lines + 1 and p.message for p in exc.problems)
        assert str(exc).startswith("line ")
        assert fingerprint(s.store) == before  # no version, no rewards
        return
    assert res.status in ("done", "unchanged"), res
    if res.status == "done":  # a version of exactly the scope: a finite total, or NULL with the reason
        rows = version_rows(s, res.rule_version_id)
        assert res.scored == len(rows) == 8
        assert rows["value"].isna().sum() == res.failed
        assert rows[rows["value"].isna()]["error"].str.len().between(1, rules.MAX_ERROR_CHARS + 40).all()


def reward_body(body: str) -> str:
    return f"def reward(prompt, completion, gold, steps, **ctx):\n    {body}\n"


# (source, where the problem is, what the message says): refused before anything runs
REFUSED = {
    "syntax error": (reward_body("return (1 +"), 2, "never closed"),
    "no reward function": ("def score(prompt, completion, gold, steps):\n    return 1.0\n", 1, "def reward("),
    "reward is a lambda": ("reward = lambda p, c, g, s, **k: 1.0\n", 1, "def reward("),
    "too few arguments": ("def reward(prompt):\n    return 1.0\n", 1, "reward takes"),
    "return outside a function": ("return 1.0\n" + GOOD_RULE, 1, "'return' outside function"),
    "duplicate argument": ("def reward(p, p, gold, steps, **ctx):\n    return 1.0\n", 1, "duplicate argument"),
    "break outside a loop": (GOOD_RULE + "break\n", 3, "'break' outside loop"),
    "unknown future feature": ("from __future__ import braces\n" + GOOD_RULE, 1, "not a chance"),
    "nonlocal without binding": (reward_body("nonlocal x\n    return 1.0"), 2, "nonlocal"),
    "nested too deeply": ("x = " + "-" * 100_000 + "1\n" + GOOD_RULE, 1, "nested too deeply"),
    "null byte": (GOOD_RULE + "\x00", 1, "null bytes"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_rule_that_cannot_run_is_refused_and_nothing_is_stored(s, group, case):
    source, line, says = REFUSED[case]
    before = fingerprint(s.store)
    with pytest.raises(RuleSourceError) as exc:
        apply(s, source, group)
    assert says in str(exc.value) and exc.value.problems[0].line == line
    assert fingerprint(s.store) == before


# (source, what every rollout's stored error says): runs, each rollout fails with its reason
FAILS_PER_ROLLOUT = {
    "raises": (reward_body("return 1 / 0"), "line 2, in reward"),
    "returns NaN": (reward_body("return float('nan')"), "non-finite"),
    "returns inf in a component": (reward_body("return {'a': float('inf')}"), "non-finite value (a=inf"),
    "returns a string": (reward_body("return 'high'"), "returned str"),
    "returns None": (reward_body("pass"), "returned NoneType"),
    "returns an empty dict": (reward_body("return {}"), "empty dict"),
    "returns a non-number component": (reward_body("return {'a': [1]}"), "component 'a' is list"),
    "returns an int too large for a float": (reward_body("return 10 ** 400"), "OverflowError"),
    "is a generator": (reward_body("yield 1.0"), "returned generator"),
    "step_reward returns NaN": (GOOD_RULE + "def step_reward(prompt, step, gold, **ctx):\n    return float('nan')\n",
                                "step_reward returned nan"),
    "fails at load": ("import no_such_module_for_rules\n" + GOOD_RULE, "failed to load"),
    "loops forever": (reward_body("while True:\n        pass"), "timed out"),
    "raises with a huge message": (reward_body("raise ValueError('x' * 1_000_000)"), "ValueError: xxx"),
}


@pytest.mark.parametrize("case", FAILS_PER_ROLLOUT)
def test_rule_that_fails_on_rollouts_stores_each_reason(s, group, case):
    """The documented contract: a version whose totals are NULL with the message, nothing else."""
    source, says = FAILS_PER_ROLLOUT[case]
    res = apply(s, source, group, name=case)
    assert res.status == "done" and res.failed == 8 and says in res.errors[0][1], res
    rows = version_rows(s, res.rule_version_id)
    assert len(rows) == 8 and rows["value"].isna().all()
    assert rows["error"].str.contains(says, regex=False).all()
    assert rows["error"].str.len().max() <= rules.MAX_ERROR_CHARS + 40  # a huge message is clipped
    others = s.store.scalar("SELECT count(*) FROM rewards WHERE rule_version_id = ? AND value IS NOT NULL",
                            [res.rule_version_id])
    assert others == 0  # no component of a failed rollout is stored as if it counted


# the sandbox gives up on the whole apply: nothing stored
STOPS = {
    "kills its worker": (reward_body("import os\n    os._exit(3)"), FAST, "worker died"),
    "loops in C, past the budget": (reward_body("return sum(range(10 ** 12))"), Limits(call_s=0.2, budget_s=1.0),
                                    "budget"),
}


@pytest.mark.parametrize("case", STOPS)
def test_rule_the_sandbox_stops_stores_nothing(s, group, case, caplog):
    source, limits, says = STOPS[case]
    before = fingerprint(s.store)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        res = apply(s, source, group, limits)
        gc.collect()  # an abandoned future logs 'exception was never retrieved' when collected
    assert res.status == "failed" and says in res.message and "nothing was stored" in res.message
    assert fingerprint(s.store) == before
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


@pytest.mark.parametrize("body", ["import os\n    return float(len(os.getcwd()) > 0)",  # a process sandbox: os works
                                  "print('x' * 1_000_000)\n    return 1.0",  # huge output on stdout
                                  "return {f'c{i}': 0.001 for i in range(500)}"])  # many components
def test_rule_that_works_oddly_still_scores(s, group, body):
    res = apply(s, reward_body(body), group)
    assert res.status == "done" and res.failed == 0 and res.scored == 8
    assert version_rows(s, res.rule_version_id)["value"].notna().all()


def is_module_path(text: str) -> bool:
    return bool(text) and all(p.isidentifier() for p in text.split("."))


@SWEEP
@given(spec=st.one_of(st.text(max_size=40).filter(lambda t: "def reward" not in t and not is_module_path(t)),
                      st.sampled_from(["", " ", ".x", "x.", "a..b", ".", "os", "json", "studio.rewardlib",
                                       "no_such_rule_module", "no/such/rule.py", "~no_such_user_x/rule.py", "rule.py",
                                       "def reward", "def reward(prompt, completion, gold, steps, **ctx):\n    return ("])))
def test_studio_score_takes_a_rule_or_says_what_is_wrong(s, spec):
    """``Studio.score(rule=...)`` as ``rollout-studio score --rule`` uses it: source, a .py file or a module."""
    before = fingerprint(s.store)
    with pytest.raises((RuleSourceError, StudioAPIError, ValueError, FileNotFoundError)) as exc:
        s.score(spec)
    msg = str(exc.value)
    assert msg and "Traceback" not in msg
    if exc.type is FileNotFoundError:
        assert spec in msg  # names the file
    elif exc.type is ValueError:
        assert repr(spec)[:20] in msg or spec in msg  # names the module path
    assert fingerprint(s.store) == before


# ============================================================================ API arguments

ROLLOUT_ARGS = ["run", "prompt", "correct", "reward", "group", "step", "rule_version", "estimator", "limit", "offset"]


@SWEEP
@given(arg=st.sampled_from(ROLLOUT_ARGS), value=WEIRD)
def test_rollouts_gives_a_page_or_names_the_bad_argument(s, arg, value):
    before = fingerprint(s.store)
    try:
        df = s.rollouts(**{arg: value})
    except StudioAPIError as exc:
        assert arg in str(exc) or arg.replace("_", " ") in str(exc), str(exc)
    else:
        assert isinstance(df, pd.DataFrame) and len(df) <= (value if arg == "limit" else 1000)
        if arg == "prompt" and value and value.strip():
            assert df["prompt"].str.lower().str.contains(value.strip().lower(), regex=False).all()
    assert fingerprint(s.store) == before


@SWEEP
@given(filters=st.fixed_dictionaries({}, optional={
    "run": st.sampled_from(INJECTIONS), "prompt": st.sampled_from(INJECTIONS) | st.text(max_size=12),
    "group": st.sampled_from(INJECTIONS), "correct": st.sampled_from([True, False]),
    "reward": st.tuples(st.none() | st.floats(-1e300, 1e300), st.none() | st.floats(allow_nan=False)),
    "step": st.integers(-2**63 + 1, 2**63 - 1), "limit": st.integers(1, 2**62), "offset": st.integers(0, 2**62 - 1)}))
def test_valid_filters_in_any_combination_are_a_query_not_a_change(s, filters):
    before = fingerprint(s.store)
    df = s.rollouts(**filters)
    assert len(df) <= min(filters.get("limit", 1000), 512)
    if filters.get("reward", (None,))[0] is not None:
        assert (df["reward"] >= filters["reward"][0]).all()
    assert fingerprint(s.store) == before


@SWEEP
@given(method=st.sampled_from(["rollout", "tokens", "group", "groups"]), value=WEIRD)
def test_lookups_by_id_give_a_result_or_a_named_error(s, method, value):
    before = fingerprint(s.store)
    try:
        out = getattr(s, method)(value)
    except StudioAPIError as exc:
        msg = str(exc)
        assert repr(value)[:20] in msg or ("must be a string" in msg and ("rollout_id" in msg or method in msg
                                                                          or "run" in msg))
    else:
        assert isinstance(out, (dict, pd.DataFrame))
        if method == "groups" and value:
            assert out.empty  # a run id nobody has
    assert fingerprint(s.store) == before


WRITES = ["DELETE FROM rollouts", "DROP TABLE rewards", "INSERT INTO runs SELECT * FROM runs",
          "UPDATE rewards SET value = 0", "CREATE TABLE x AS SELECT 1", "ATTACH ':memory:' AS x", "CHECKPOINT",
          "COPY rollouts TO '/tmp/x.csv'", "PRAGMA enable_profiling", "SET threads = 1", "INSTALL httpfs",
          "SELECT 1; DELETE FROM rollouts", "WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x",
          "SELECT * FROM read_csv('/etc/passwd')", "SELECT getenv('HOME')", "SELECT * FROM '/etc/passwd'",
          "SELECT * FROM query('DELETE FROM runs')", "EXPORT DATABASE '/tmp/x'", "CALL pragma_version()",
          "SELECT * FROM duckdb_settings()", "VACUUM", "LOAD json", "DETACH memory", "USE memory"]


@SWEEP
@given(query=st.one_of(st.sampled_from(WRITES), st.text(max_size=60),
                       st.text(max_size=20).map(lambda t: f"SELECT {t} FROM rollouts"),
                       st.sampled_from(INJECTIONS).map(lambda t: f"SELECT * FROM rollouts WHERE run_id = '{t}'")))
def test_sql_runs_one_select_or_refuses_it_with_the_reason(s, query):
    before = fingerprint(s.store)
    try:
        df = s.sql(query)
    except (ReadOnlyError, StudioAPIError, QueryTimeout) as exc:
        assert len(str(exc)) > 10
    else:
        assert query not in WRITES, f"{query!r} ran"
        assert isinstance(df, pd.DataFrame) and len(df) <= 1000
    assert fingerprint(s.store) == before


def field_words(field: str) -> tuple[str, ...]:
    """How PairRule's messages name a field ('min margin', the rule's 'pair rule')."""
    return {"name": ("name", "pair rule"), "correct_component": ("correct_component", "component"),
            "per_prompt_cap": ("per_prompt_cap", "per-prompt cap")}.get(
        field, (field, field.replace("_", " ")))


@FEW
@given(field=st.sampled_from([f for f in PairRule.__dataclass_fields__] + ["bogus", "run_ids"]), value=WEIRD)
def test_build_pairs_builds_or_names_the_bad_field(s, field, value):
    before = fingerprint(s.store)
    try:
        s.build_pairs(**{field: value})
    except (StudioAPIError, CurationError) as exc:
        assert any(w in str(exc) for w in field_words(field)), str(exc)
        assert fingerprint(s.store) == before


@FEW
@given(run=WEIRD.filter(lambda v: v is not None))
def test_build_pairs_run_is_a_known_run_id(s, run):
    before = fingerprint(s.store)
    with pytest.raises(StudioAPIError, match="run"):
        s.build_pairs(run=run)
    assert fingerprint(s.store) == before


EXPORT_OPTIONS = ["filetype", "overwrite", "skip_stale", "build_id", "kinds", "pair_ids", "step_source",
                  "step_threshold", "answer_step", "correct_component", "correct_threshold", "conflicts", "bogus"]


@SWEEP
@given(name=st.text(st.characters(blacklist_characters="/\x00"), min_size=1, max_size=20).filter(
           lambda n: n not in (".", "..")),
       format=st.sampled_from(["preference", "unpaired", "stepwise"]) | WEIRD,
       style=st.sampled_from(["standard", "conversational"]) | WEIRD, option=st.sampled_from(EXPORT_OPTIONS),
       value=WEIRD)
def test_export_refuses_bad_arguments_and_writes_nothing(s, tmp_path, name, format, style, option, value):
    """No pair is accepted in this store: every export is refused, with the reason, and no file appears."""
    before = fingerprint(s.store)
    out = tmp_path / "exports"
    out.mkdir(exist_ok=True)
    with pytest.raises((StudioAPIError, CurationError)) as exc:
        s.export(out / name, format=format, style=style, **{option: value})
    msg = str(exc.value)
    assert any(w in msg for w in ("format", "style", option, option.replace("_", " "), "nothing to export")), msg
    assert not any(out.iterdir())
    assert fingerprint(s.store) == before


@SWEEP
@given(path=WEIRD.filter(lambda v: not isinstance(v, str)))
def test_export_path_must_be_a_path(s, path):
    with pytest.raises(StudioAPIError, match="path"):
        s.export(path)


@FEW
@given(which=st.sampled_from(["rollout", "group", "fork_tree"]), value=WEIRD | st.just("real"),
       channel=st.sampled_from(["entropy", "logprob"]) | WEIRD, title=st.none() | st.text(max_size=30)
       | st.just("<script>alert(1)</script>"))
def test_save_html_writes_the_page_or_names_the_bad_argument(s, tmp_path, which, value, channel, title):
    if value == "real":
        value = s.store.scalar("SELECT rollout_id FROM rollouts ORDER BY rollout_id LIMIT 1")
    before = fingerprint(s.store)
    try:
        path = s.save_html(tmp_path / "page.html", **{which: value}, channel=channel, title=title)
    except StudioAPIError as exc:
        msg = str(exc)
        assert any(w in msg for w in (which, "channel", "title", "exactly one", "neither a group id", "no rollout"))
    else:
        html = path.read_text()
        assert html.startswith("<!DOCTYPE html>") or html.lstrip().lower().startswith("<!doctype html")
        assert "<script>alert(1)</script>" not in html  # a title is text, never markup
    assert fingerprint(s.store) == before


@SWEEP
@given(db=WEIRD.filter(lambda v: v is not None), policy=st.none() | WEIRD, create=WEIRD)
def test_open_opens_a_store_or_says_why_not(tmp_path, monkeypatch, db, policy, create):
    """Relative paths land in an empty directory: nothing may appear there unless create=True asked for it."""
    monkeypatch.chdir(tmp_path)
    assume(not (create is True and isinstance(db, str)))  # creating a store is not refusing one
    before = sorted(p.name for p in tmp_path.iterdir())
    try:
        st_ = studio.open(db, policy, create=create)
    except (StudioAPIError, StoreError) as exc:
        assert str(exc)
    else:
        st_.close()
        assert db == ":memory:"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@FEW
@given(prompts=WEIRD.filter(lambda v: not isinstance(v, str)))
def test_generate_prompts_must_be_text(s, prompts):
    """Typed prompt text is swept in test_bad_input; here the type: nothing is sampled or stored."""
    before = fingerprint(s.store)
    with pytest.raises((StudioAPIError, TaskParseError, ConfigError), match="prompt"):
        s.generate(prompts)
    assert fingerprint(s.store) == before


@FEW
@given(arg=st.sampled_from(["rule", "reward_model", "name", "note", "run"]), value=WEIRD)
def test_score_arguments_are_checked_before_anything_runs(s, arg, value):
    assume(not (arg == "run" and not value))  # no run: every rollout, for real
    kwargs = {"rule": GOOD_RULE, "run": "no-such-run", arg: value}
    if arg == "reward_model":
        kwargs["rule"] = None
    before = fingerprint(s.store)
    try:
        s.score(**kwargs)
    except (StudioAPIError, RuleSourceError, ValueError, OSError, PolicyLoadError) as exc:
        assert str(exc)
    else:
        raise AssertionError(f"score({kwargs}) ran")
    assert fingerprint(s.store) == before


# ============================================================================ CLI argv

def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``rollout-studio ARGV`` in-process through the console script's entry point."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["rollout-studio", *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
            cli.entry()
    finally:
        sys.argv = old
    return exc.value.code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def cli_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    Store.open(d / "s.duckdb", seed_dir=ROLLOUTS_DIR).close()
    (d / "syntax.py").write_text(REFUSED["syntax error"][0])
    (d / "noreward.py").write_text(REFUSED["no reward function"][0])
    (d / "nocompile.py").write_text(REFUSED["return outside a function"][0])
    (d / "good.py").write_text(GOOD_RULE)
    (d / "bad.jsonl").write_text('{"input": 1}\n{not json\n')
    (d / "empty").mkdir()
    (d / "notastore.duckdb").write_text("hello")
    return d


task = get_task("arithmetic")


def unreadable_prompt(text: str) -> bool:
    try:
        task.parse_prompt(text)
    except TaskParseError:
        return True
    return False


ARG = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=15)
NUM = st.one_of(st.integers(-10**6, 10**6).map(str), st.sampled_from(["nan", "inf", "-0", "1e999", "0x10", "", "½"]))


def options(d: Path) -> dict[str, list]:
    """Per subcommand: (option, value strategy or None for a flag). Values are bad or harmless: never
    a valid prompt, rule, policy or import that would sample, score or import for real."""
    paths = st.sampled_from([str(d / n) for n in ("nope.py", "syntax.py", "noreward.py", "nocompile.py", "empty",
                                                  "bad.jsonl", "missing.jsonl", "notastore.duckdb")]) | ARG
    return {
        "generate": [("--prompt", ARG.filter(unreadable_prompt)), ("--prompts", paths), ("--fresh", NUM.filter(
            lambda v: not v.lstrip("-").isdigit() or int(v) <= 0)), ("--difficulty", ARG), ("--task", ARG),
            ("--group-size", NUM), ("--temperature", NUM), ("--top-p", NUM), ("--max-new-tokens", NUM),
            ("--seed", NUM), ("--top-k-stats", NUM), ("--policy", paths), ("--name", ARG)],
        "score": [("--rule", paths | st.sampled_from([".x", "a..b", "os", "no_such_rule_module", ""])),
                  ("--reward-model", paths), ("--name", ARG), ("--note", ARG), ("--run", ARG)],
        "import": [("", paths), ("--format", ARG | st.sampled_from(["trl", "verl", "openrlhf", "generic"])),
                   ("--map", ARG | ARG.map(lambda t: f"{t}=x")), ("--skip-bad", None), ("--name", ARG),
                   ("--task", ARG), ("--interval", NUM)],
        "export": [("--out", st.sampled_from([str(d / "out.jsonl"), str(d / "out.html"), str(d / "empty")]) | ARG),
                   ("--format", ARG), ("--style", ARG), ("--filetype", ARG), ("--build", ARG), ("--kind", ARG),
                   ("--step-threshold", NUM), ("--rollout", ARG), ("--group", ARG), ("--fork-tree", ARG),
                   ("--channel", ARG), ("--overwrite", None), ("--skip-stale", None), ("--conflicts", ARG)],
        "curate": [("", st.sampled_from(["build", "accept", "reject", "status", "export"]) | ARG),
                   ("--rule", ARG), ("--min-margin", NUM), ("--length-match", NUM), ("--per-prompt-cap", NUM),
                   ("--within", ARG), ("--run", ARG), ("--version", ARG), ("--pair", ARG), ("--build", ARG),
                   ("--all", None), ("--out", ARG)],
        "enrich": [("--policy", paths.filter(lambda p: p != "sample")), ("--run", ARG), ("--batch", NUM)],
        # these two serve until stopped: only argv that cannot parse (an unknown option is always added)
        "serve": [("--port", NUM), ("--address", ARG), ("--policy", paths), ("--basic-auth", ARG), ("--admins", ARG)],
        "backend": [("--port", NUM), ("--policy", paths), ("--host", ARG)],
    }


CLI_STORE: dict[Path, list] = {}


@pytest.mark.parametrize("sub", ["generate", "score", "import", "export", "curate", "enrich", "serve", "backend"])
@settings(SWEEP, max_examples=8)
@given(data=st.data())
def test_cli_subcommand_argv_follows_the_exit_code_contract(cli_dir, sub, data):
    opts = options(cli_dir)[sub]
    picked = data.draw(st.lists(st.sampled_from(opts), max_size=4))
    argv = [sub]
    if sub == "curate":  # its sub-subcommand comes first, as a user types it
        argv.append(data.draw(opts[0][1]))
    # import makes a new store at --db when its files can be read (a store is where imports go)
    missing = [] if sub == "import" else [str(cli_dir / "missing.duckdb")]
    argv += ["--db", data.draw(st.sampled_from([str(cli_dir / "s.duckdb")] * 4 + missing + [
        str(cli_dir / "notastore.duckdb"), str(cli_dir / "empty"), "~no_such_user_x/s.duckdb"]))]
    for opt, values in picked:
        if opt:
            argv.append(opt)
        if values is not None and (sub != "curate" or opt):
            argv.append(data.draw(values))
    if sub in ("serve", "backend"):
        argv.append("--no-such-option-" + data.draw(st.text("abc", max_size=3)))
    db = cli_dir / "s.duckdb"
    before = CLI_STORE.setdefault(db, file_fingerprint(db))  # what the last example left
    code, out, err = run_cli(argv)
    assert "Traceback" not in out + err, (argv, out + err)
    assert code in (0, 1, 2), (argv, code, out, err)
    if code == 2:  # bad input: said on stderr, nothing changed
        assert err.startswith("usage:") or "error:" in err, (argv, out, err)
    elif code == 1:  # ran but did not succeed (nothing to export, refused): said, nothing changed
        assert err or out
    if code == 0:  # done: it may have changed the store (curate build)
        CLI_STORE[db] = file_fingerprint(db)
    else:
        assert file_fingerprint(db) == before, (argv, code, out, err)
    assert not (cli_dir / "missing.duckdb").exists()  # commands never create a store at a mistyped path


@settings(SWEEP, max_examples=20)
@given(argv=st.lists(ARG, max_size=3))
def test_cli_top_level_argv_is_usage_or_a_subcommand(argv):
    assume(not argv or argv[0] not in cli.COMMANDS)
    code, out, err = run_cli(argv)
    assert "Traceback" not in out + err
    if argv and argv[0] in ("-h", "--help", "--version"):
        assert code == 0 and out
    else:
        assert code == 2 and err.startswith("usage:")


def test_cli_import_refusal_creates_no_store_and_goes_to_stderr(tmp_path):
    code, out, err = run_cli(["import", "--db", str(tmp_path / "typo.duckdb"), str(tmp_path / "none.jsonl")])
    assert code == 2
    assert not (tmp_path / "typo.duckdb").exists(), "exit 2 promises nothing changed, yet a store was made"
    assert err.startswith("error:") and not out


@pytest.mark.parametrize("argv, says", [
    (["score", "--rule", "{d}/nocompile.py"], "'return' outside function"),  # before: exit 1, a version of NULLs
    (["score", "--rule", ".x"], "is not a rule"),  # before: TypeError traceback from importlib
    (["score", "--rule", "{d}/good.py", "--run", "no-such-run"], "no run 'no-such-run'"),  # before: 'unchanged'
    (["score", "--rule", "{d}/syntax.py"], "line 2"),
])
def test_cli_score_refuses_bad_rules_with_exit_2(cli_dir, argv, says):
    before = file_fingerprint(cli_dir / "s.duckdb")
    code, out, err = run_cli([a.format(d=cli_dir) for a in argv] + ["--db", str(cli_dir / "s.duckdb")])
    assert code == 2 and err.startswith("error:") and says in err, (code, out, err)
    assert file_fingerprint(cli_dir / "s.duckdb") == before


# ============================================================================ the served page's URL

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``launch.py`` on a free loopback port (the UI tests' Server), over a seeded store whose
    fingerprint is taken before it starts; the last test stops it and compares."""
    from tests.ui.conftest import Server

    db = tmp_path_factory.mktemp("served") / "studio.duckdb"
    Store.open(db, seed_dir=ROLLOUTS_DIR).close()
    before = file_fingerprint(db)
    srv = Server(db)
    yield srv, db, before
    srv.stop()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a redirect is an answer to check, not to follow


OPENER = urllib.request.build_opener(NoRedirect)


def get(url: str) -> tuple[int | None, str, dict]:
    """Status, body and headers; None when the server closed the connection without an answer."""
    try:
        with OPENER.open(url, timeout=60) as r:
            return r.status, r.read().decode(errors="replace"), dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace"), dict(exc.headers)
    except (urllib.error.URLError, ConnectionError) as exc:
        if isinstance(getattr(exc, "reason", exc), ConnectionRefusedError):
            raise
        return None, "", {}


QUERY_KEYS = st.sampled_from(["rollout", "group", "run", "tab", "theme", "bokeh-session-id", "bokeh-absolute-url",
                              "bokeh-app-path", "bokeh-autoload-element", "autoreload", "embed", "a"]) | ARG
QUERY_VALUES = st.sampled_from(INJECTIONS + ["<script>alert(1)</script>", "x" * 4000, "%ff%fe", "javascript:x"]) | ARG


@settings(SWEEP, max_examples=5)  # each page builds a whole session: ~1.5 s on 2 busy cores
@given(query=st.lists(st.tuples(QUERY_KEYS, QUERY_VALUES), min_size=1, max_size=3))
def test_page_with_any_query_is_the_page(served, query):
    srv, _, _ = served
    since = len(srv.output())
    code, body, _ = get(srv.url + "?" + urllib.parse.urlencode(query))
    assert code == 200 or (code is not None and 400 <= code < 500), (query, code)
    if code == 200:
        assert "Rollout Studio" in body and "<script>alert(1)</script>" not in body
    assert srv.proc.poll() is None and not srv.tracebacks(since), srv.tracebacks(since)


@settings(SWEEP, max_examples=30)
@given(path=st.one_of(ARG.filter(bool), st.sampled_from([
    "static/../../etc/passwd", "static/%2e%2e/%2e%2e/etc/passwd", "..%2f..%2fetc/passwd", "ws", "autoload.js",
    "static/js/bokeh.min.js?v=<script>", "%00", "%ff", "a" * 2000, "//evil.example/", "index.html", "metadata"])),
    query=st.none() | st.lists(st.tuples(ARG, QUERY_VALUES), max_size=2))
def test_any_other_path_is_an_answer_not_a_crash(served, path, query):
    srv, _, _ = served
    since = len(srv.output())
    url = srv.url + urllib.parse.quote(path, safe="/%").lstrip("/") + (
        "?" + urllib.parse.urlencode(query) if query else "")
    assume(urllib.parse.urlsplit(url).path not in ("", "/"))  # the page itself: the test above
    code, _, headers = get(url)
    assert code is not None and (code == 200 or 300 <= code < 500), (url, code)
    if 300 <= code < 400:  # never a redirect off the studio's host
        where = headers.get("Location", "")
        assert where.startswith(srv.url) or (where.startswith("/") and not where.startswith("//")), where
    assert srv.proc.poll() is None and not srv.tracebacks(since), srv.tracebacks(since)


def test_a_session_id_named_by_the_request_is_refused(served):
    """launch.py signs session ids: a request naming one (blank, or one a person might guess or copy)
    gets 403, never a session (Bokeh answered a blank one with a 500 and a traceback)."""
    srv, _, _ = served
    since = len(srv.output())
    for value in ("%00", "%20", "", "my-own-session-id"):
        code, _, _ = get(f"{srv.url}?bokeh-session-id={value}")
        assert code == 403, (value, code)
    assert get(srv.url)[0] == 200  # a session the server makes itself is served
    assert not srv.tracebacks(since), srv.tracebacks(since)


def test_oversized_request_is_refused_and_the_server_stays_up(served):
    """Past Tornado's 64 KB header limit the connection is closed without an answer (Tornado's
    behaviour, not a 431); the server goes on serving."""
    srv, _, _ = served
    since = len(srv.output())
    code, _, _ = get(srv.url + "?q=" + "x" * 100_000)
    assert code is None or 400 <= code < 500
    assert get(srv.url + "nope")[0] == 404
    assert srv.proc.poll() is None and not srv.tracebacks(since)


def test_served_store_is_unchanged_by_the_sweep(served):
    """Last in the module: stop the server, then read the store file it held."""
    srv, db, before = served
    assert srv.proc.poll() is None, "the server went down during the sweep"
    log = srv.output()
    assert not server_tracebacks(log), server_tracebacks(log)
    srv.stop()
    assert file_fingerprint(db) == before
