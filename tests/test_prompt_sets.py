"""Bring a prompt set: data files (JSONL, Parquet, CSV, datasets folders) become stored tasks, rebuilt
in a fresh process, drawn from deterministically; bad input is named and stores nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from studio.ingest.prompt_sets import PromptSetConfig, PromptSetError, add_prompt_set
from studio.queries.prompts import PromptDrawError, draw_prompts, split_counts, stored_tasks, task_choices
from studio.store import Store
from studio.tasks import UnknownTaskError, get_task

ROOT = Path(__file__).resolve().parents[1]
GSM8K = [  # GSM8K's shape: reasoning lines, then '#### n'
    {"question": f"Natalia sold {n} clips in April and half as many in May. How many clips in all?",
     "answer": f"In May she sold {n} / 2 = {n // 2} clips.\nIn all {n} + {n // 2} = {n + n // 2}.\n#### {n + n // 2}"}
    for n in range(2, 42, 2)]
MATH = [  # MATH's shape: a solution with \boxed{}, a level and a type
    {"problem": f"What is $\\frac{{1}}{{{k}}}$ of {2 * k}?", "solution": f"It is $2k/k = \\boxed{{{2}}}$ for k={k}.",
     "level": f"Level {1 + k % 3}", "type": "Prealgebra"} for k in range(2, 14)]
MATH[0]["solution"] = "Half of one is $\\boxed{\\frac{1}{2}}$."


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def counts(store: Store) -> tuple[int, int]:
    return store.scalar("SELECT count(*) FROM tasks"), store.scalar("SELECT count(*) FROM prompts")


@pytest.fixture()
def store(tmp_path):
    s = Store.open(tmp_path / "s.duckdb")
    yield s
    s.close()


# -- presets and mappings ---------------------------------------------------------------------------
def test_gsm8k_preset_without_a_mapping(store, tmp_path):
    rep = add_prompt_set(store, jsonl(tmp_path / "train.jsonl", GSM8K), PromptSetConfig(name="gsm"))
    assert (rep.preset, rep.n_prompts, rep.splits) == ("gsm8k", 20, {"train": 20})  # split from the file's name
    assert rep.mapping["prompt"] == "question" and rep.mapping["answer"] == "answer"
    row = store.df("SELECT * FROM tasks").iloc[0]
    spec = json.loads(row["spec"])
    assert row["kind"] == "dataset" and row["n_prompts"] == 20 and len(row["sha256"]) == 64
    assert spec["splits"] == ["train"] and spec["source"]["preset"] == "gsm8k"
    assert spec["source"]["files"][0]["format"] == "jsonl"
    p = draw_prompts(store, "gsm", 20)
    first = next(x for x in p if x.text == GSM8K[0]["question"])
    assert first.gold == {"answer": "3", "solution": GSM8K[0]["answer"]}  # 2 + 1 = 3, from '#### 3'
    assert first.meta == {"split": "train"}
    assert get_task("gsm").verdict(first, "so \\boxed{3}") == ("3", True)


def test_math_preset_keeps_level_and_other_columns(store, tmp_path):
    pd.DataFrame(MATH).to_parquet(tmp_path / "math.parquet")
    rep = add_prompt_set(store, tmp_path / "math.parquet", PromptSetConfig(name="math-set", split="test"))
    assert rep.preset == "math" and rep.splits == {"test": 12} and rep.mapping["level"] == "level"
    half = next(p for p in draw_prompts(store, "math-set", 12) if p.text == MATH[0]["problem"])
    assert half.gold["answer"] == "\\frac{1}{2}"  # the last \boxed{} of the solution
    assert half.meta == {"split": "test", "level": "Level 3", "type": "Prealgebra"}
    assert get_task("math-set").verdict(half, "\\boxed{0.5}") == ("0.5", True)  # math-verify: 1/2 = 0.5


def test_csv_with_a_mapping_keeps_every_other_column_in_meta(store, tmp_path):
    pd.DataFrame({"uid": ["a1", "a2", "a3"], "q": ["2+2?", "3*3?", "10-4?"], "gold": ["4", "9", "6"],
                  "part": ["train", "test", "test"], "hardness": ["easy", "easy", "hard"],
                  "origin": ["hand", "hand", "book"]}).to_csv(tmp_path / "mine.csv", index=False)
    cfg = PromptSetConfig(name="mine", prompt="q", answer="gold", id_column="uid", split_column="part",
                          level="hardness", extract="answer_colon", steps="line", system="Answer briefly.")
    rep = add_prompt_set(store, tmp_path / "mine.csv", cfg)
    assert rep.splits == {"train": 1, "test": 2}
    (p,) = draw_prompts(store, "mine", 5, split="test", level="hard")
    assert p.text == "10-4?" and p.gold["answer"] == "6"
    assert p.meta == {"split": "test", "level": "hard", "id": "a3", "origin": "book"}
    task = get_task("mine")
    assert task.messages(p)[0] == {"role": "system", "content": "Answer briefly."}
    assert task.verdict(p, "thinking\nAnswer: 6") == ("6", True)  # the answer_colon extractor


def test_messages_column(store, tmp_path):
    rows = [{"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": f"{i} + 1?"}],
             "answer": str(i + 1)} for i in range(4)]
    rows.append({"messages": [{"role": "user", "content": "Capital of France?"},
                              {"role": "assistant", "content": "Paris"}]})  # an SFT row: the reply is the reference
    add_prompt_set(store, jsonl(tmp_path / "chat.jsonl", rows), PromptSetConfig(name="chat", messages="messages"))
    drawn = {p.text: p for p in draw_prompts(store, "chat", 10)}
    assert drawn["2 + 1?"].messages == ({"role": "system", "content": "Be terse."}, {"role": "user", "content": "2 + 1?"})
    assert get_task("chat").messages(drawn["2 + 1?"])[0]["content"] == "Be terse."
    assert drawn["Capital of France?"].gold == {"answer": "Paris", "solution": "Paris"}
    assert drawn["Capital of France?"].messages == ({"role": "user", "content": "Capital of France?"},)


def test_datasets_folders(store, tmp_path):
    import datasets

    datasets.Dataset.from_list(GSM8K[:6]).save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(MATH[:8]),
                          "test": datasets.Dataset.from_list(MATH[8:])}).save_to_disk(str(tmp_path / "dict"))
    rep = add_prompt_set(store, tmp_path / "one", PromptSetConfig(name="ds-one", split="test"))
    assert (rep.preset, rep.splits) == ("gsm8k", {"test": 6})
    rep = add_prompt_set(store, tmp_path / "dict", PromptSetConfig(name="ds-dict", split="ignored"))
    assert (rep.preset, rep.splits) == ("math", {"train": 8, "test": 4})  # the folder's splits come first
    assert json.loads(store.scalar("SELECT spec FROM tasks WHERE name = 'ds-dict'"))["source"]["files"][0][
        "format"] == "datasets"
    assert {p.meta["split"] for p in draw_prompts(store, "ds-dict", 20, split="test")} == {"test"}


def test_the_shipped_word_problems_load_with_the_presets(store):
    gsm = ROOT / "sample_data" / "wordproblems" / "gsm8k"
    math = ROOT / "sample_data" / "wordproblems" / "math" / "test.parquet"
    rep = add_prompt_set(store, [gsm / "train.jsonl", gsm / "test.jsonl"], PromptSetConfig(name="wp-gsm8k"))
    assert rep.preset == "gsm8k" and set(rep.splits) == {"train", "test"} and not rep.skipped
    rep = add_prompt_set(store, math, PromptSetConfig(name="wp-math", preset="math"))
    assert rep.splits == {"test": rep.n_prompts} and rep.n_prompts > 0 and not rep.skipped
    assert all(p.gold["answer"] and p.meta["level"].startswith("Level") for p in draw_prompts(store, "wp-math", 20))


# -- reading back ----------------------------------------------------------------------------------
def test_draw_is_deterministic_per_seed_and_respects_split(store, tmp_path):
    jsonl(tmp_path / "train.jsonl", GSM8K[:14])
    jsonl(tmp_path / "test.jsonl", GSM8K[14:])
    add_prompt_set(store, [tmp_path / "train.jsonl", tmp_path / "test.jsonl"], PromptSetConfig(name="gsm"))
    assert split_counts(store, "gsm") == {"train": 14, "test": 6}
    texts = [p.text for p in draw_prompts(store, "gsm", 5, seed=3)]
    assert texts == [p.text for p in draw_prompts(store, "gsm", 5, seed=3)] and len(set(texts)) == 5
    assert [p.text for p in draw_prompts(store, "gsm", 14, seed=4)] != [p.text for p in draw_prompts(store, "gsm", 14, seed=3)]
    test = draw_prompts(store, "gsm", 50, split="test")
    assert len(test) == 6 and {p.meta["split"] for p in test} == {"test"}  # all of a split smaller than n
    with pytest.raises(PromptDrawError, match=r"no split 'dev'; its splits: train \(14 prompts\), test \(6"):
        draw_prompts(store, "gsm", 2, split="dev")
    with pytest.raises(PromptDrawError, match="has no prompts of level '2'; its prompts have no level"):
        draw_prompts(store, "gsm", 2, level="2")
    with pytest.raises(UnknownTaskError, match="unknown task 'nope'.*arithmetic"):
        draw_prompts(store, "nope", 2)
    made = draw_prompts(store, "arithmetic", 3, seed=1, split="easy")  # a built-in task makes its prompts
    assert [p.text for p in made] == [p.text for p in get_task("arithmetic").make_prompts(3, 1, "easy")]
    assert task_choices(store)[-1] == "gsm" and "arithmetic" in task_choices(store)
    listed = stored_tasks(store)
    assert listed.loc[0, "name"] == "gsm" and listed.loc[0, "splits"] == {"train": 14, "test": 6}


def test_a_fresh_process_rebuilds_the_task_from_the_store(tmp_path):
    db = tmp_path / "s.duckdb"
    s = Store.open(db)
    add_prompt_set(s, jsonl(tmp_path / "train.jsonl", GSM8K),
                   PromptSetConfig(name="gsm-fresh", system="Reason, then box.", thinking=False, extract="boxed"))
    here = [p.text for p in draw_prompts(s, "gsm-fresh", 4, seed=7)]
    s.close()
    code = ("import json, sys; from studio.store import Store; from studio.tasks import get_task; "
            "from studio.queries.prompts import draw_prompts; s = Store.open(sys.argv[1]); t = get_task('gsm-fresh'); "
            "print(json.dumps({'template': t.template, 'splits': list(t.splits), 'extract': t.extractor, "
            "'texts': [p.text for p in draw_prompts(s, 'gsm-fresh', 4, seed=7)]}))")
    out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got == {"template": {"system": "Reason, then box.", "thinking": False}, "splits": ["train"],
                   "extract": "boxed", "texts": here}


# -- bad input: a specific message, nothing stored -------------------------------------------------
def _bad_files(tmp: Path) -> dict[str, Path]:
    files = {"gsm": jsonl(tmp / "gsm.jsonl", GSM8K[:3]), "plain": jsonl(tmp / "plain.jsonl", [{"q": "2+2?", "a": "4"}])}
    files["no_gold"] = jsonl(tmp / "no_gold.jsonl", [GSM8K[0], {"question": "Why?", "answer": "Because the sky, "
                             "as everybody knows since the old days of sailing ships, is blue\nand wide."}, GSM8K[1]])
    files["malformed"] = tmp / "malformed.jsonl"
    files["malformed"].write_text(json.dumps(GSM8K[0]) + "\n{\"question\": \"cut off\n")
    files["corrupt"] = tmp / "corrupt.parquet"
    files["corrupt"].write_bytes(b"PAR1 this is not parquet at all")
    files["text"] = tmp / "notes.txt"
    files["text"].write_text("hello")
    (tmp / "folder").mkdir()
    (tmp / "folder" / "x.jsonl").write_text("{}")
    files["folder"] = tmp / "folder"
    files["bad_chat"] = jsonl(tmp / "chat.jsonl", [{"messages": [{"role": "user"}], "answer": "1"}])
    return files


BAD = [  # (file, settings, what the message must say)
    ("plain", {"preset": "gsm8k"}, r"has no column 'question', which preset gsm8k reads as the prompt; its columns: 'q', 'a'"),
    ("gsm", {"prompt": "qestion"}, r"has no column 'qestion' \(given as the prompt column\); its columns: 'question', 'answer'"),
    ("plain", {}, r"cannot tell which column of .*plain.jsonl holds the prompt; its columns: 'q', 'a'"),
    ("no_gold", {}, r"1 unreadable row, nothing was stored .*no_gold.jsonl:2: no gold answer can be read from column 'answer'"),
    ("malformed", {}, r"malformed.jsonl:2: malformed JSON line"),
    ("corrupt", {}, r"corrupt.parquet is not a readable parquet file"),
    ("text", {}, r"notes.txt: cannot read a .txt file"),
    ("folder", {}, r"is a folder but not a datasets folder"),
    ("bad_chat", {"messages": "messages"}, r"chat.jsonl:1: column 'messages' message 1 is not a \{role, content\}"),
    ("gsm", {"extract": "regex", "regex": "("}, r"answer regex '\(' does not compile"),
    ("gsm", {"extract": "regex", "regex": r"\d+"}, r"needs a group around the answer"),
    ("gsm", {"steps": "sentence"}, r"step mode must be one of auto, paragraph, line, got 'sentence'"),
    ("gsm", {"name": "arithmetic"}, r"'arithmetic' is a built-in task; give the prompt set another name"),
    ("gsm", {"name": "import"}, r"'import' is a built-in task"),
    ("gsm", {"name": "9 lives"}, r"a task name is letters, digits"),
    ("gsm", {"name": "taken"}, r"already has a task 'taken' \(3 prompts from .*gsm.jsonl\); give the new prompt set"),
    ("gsm", {"prompt": "question", "messages": "answer"}, r"a prompt column or a messages column, not both"),
]


@pytest.mark.parametrize(("file", "settings", "message"), BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_is_named_and_nothing_is_stored(store, tmp_path, file, settings, message):
    files = _bad_files(tmp_path)
    add_prompt_set(store, files["gsm"], PromptSetConfig(name="taken"))
    before = counts(store)
    with pytest.raises(PromptSetError, match=message) as err:
        add_prompt_set(store, files[file], PromptSetConfig(**({"name": "new"} | settings)))
    assert err.value.exit_code == 2
    assert counts(store) == before
    with pytest.raises(UnknownTaskError):
        get_task("new")


def test_unreadable_rows_can_be_skipped_and_are_counted(store, tmp_path):
    files = _bad_files(tmp_path)
    rep = add_prompt_set(store, [files["no_gold"], files["malformed"]],
                         PromptSetConfig(name="skips", skip_unreadable=True))
    assert rep.n_prompts == 2 and rep.n_duplicates == 1  # GSM8K[0] is in both files: stored once
    assert len(rep.skipped) == 2 and "no_gold.jsonl:2" in rep.skipped[0] and "malformed.jsonl:2" in rep.skipped[1]
    assert "2 unreadable rows skipped" in rep.summary()


def test_files_of_one_set_share_their_columns(store, tmp_path):
    files = _bad_files(tmp_path)
    with pytest.raises(PromptSetError, match=r"plain.jsonl has no column 'question', which .*gsm.jsonl has"):
        add_prompt_set(store, [files["gsm"], files["plain"]], PromptSetConfig(name="mixed"))
    assert counts(store) == (0, 0)


# -- faces -----------------------------------------------------------------------------------------
def test_python_api(tmp_path):
    import studio
    from studio.face.api import Studio

    with studio.open(tmp_path / "api.duckdb", create=True) as s:
        assert isinstance(s, Studio)
        rep = s.add_prompt_set(jsonl(tmp_path / "test.jsonl", GSM8K), name="api-gsm")
        assert rep.splits == {"test": 20}
        assert list(s.tasks()["name"]) == ["api-gsm"]
        assert len(s.draw_prompts("api-gsm", 3, seed=1, split="test")) == 3
        with pytest.raises(PromptSetError, match="unknown prompt set setting colum; known: .*answer"):
            s.add_prompt_set(tmp_path / "test.jsonl", name="x", colum="q")


def test_cli_task_add_list_show(tmp_path):
    jsonl(tmp_path / "train.jsonl", GSM8K)
    db = str(tmp_path / "cli.duckdb")
    env = dict(os.environ, PYTHONPATH=str(ROOT), ROLLOUT_STUDIO_DB=str(tmp_path / "default.duckdb"))

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "studio.face.cli", "task", *args, "--db", db],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)

    out = cli("add", "wp", str(tmp_path / "train.jsonl"), "--system", "Box the answer.", "--thinking", "off")
    assert out.returncode == 0, out.stderr
    assert "task 'wp': 20 prompts (train 20)" in out.stdout
    out = cli("add", "wp2", str(tmp_path / "train.jsonl"), "--prompt", "problem")
    assert out.returncode == 2 and "has no column 'problem'" in out.stderr and "Traceback" not in out.stderr
    out = cli("list")
    assert out.returncode == 0 and "wp\tdataset\t20 prompts (train 20)" in out.stdout and "arithmetic" in out.stdout
    out = cli("show", "wp", "--split", "train", "--n", "2")
    assert out.returncode == 0, out.stderr
    assert "splits: train 20" in out.stdout and out.stdout.count("gold: ") == 2 and "'thinking': False" in out.stdout
    out = cli("show", "wp", "--split", "test")
    assert out.returncode == 2 and "no split 'test'; its splits: train (20 prompts)" in out.stderr
    out = cli("show", "nope")
    assert out.returncode == 2 and "unknown task 'nope'" in out.stderr
