"""``rollout-studio``: the studio's command line.

    rollout-studio serve     [--db PATH] [--policy PATH] [--port N] …   the studio in a browser
    rollout-studio generate  --prompt 'Q: 23+48-7=' [--fresh N] …      sample, score and store
    rollout-studio score     --rule FILE.py | --reward-model FOLDER    re-score stored rollouts
    rollout-studio import    PATH… [--format F] [--skip-bad] [--tail]  a training run's rollouts
    rollout-studio export    --out pairs.jsonl | --out r.html --rollout ID   TRL data or static HTML
    rollout-studio curate    build|accept|reject|status …               preference pairs
    rollout-studio enrich    --policy FOLDER [--run ID]                 fill in missing token stats
    rollout-studio backend   --policy PATH [--port N] …                 a policy over HTTP (OpenAI API)

Exit codes, the same for every subcommand (scripts rely on them):

====  =====================================================================================
0     done
1     ran, but did not succeed: a run failed or was cancelled, a rule failed on rollouts,
      nothing to export, stale pairs refused
2     bad input, nothing changed: unknown option, missing store or policy, unreadable
      prompt, rule or file, malformed import records (without ``--skip-bad``)
130   interrupted (Ctrl-C)
====  =====================================================================================
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROG = "rollout-studio"
OK, FAILED, BAD_INPUT, INTERRUPTED = 0, 1, 2, 130

COMMANDS = {
    "serve": "serve the studio in a browser (127.0.0.1 unless given authentication)",
    "generate": "sample completions from a policy, score and store them",
    "score": "re-score stored rollouts with a reward rule or a reward model (a new rule version)",
    "import": "import a training run's rollouts (TRL, verl, OpenRLHF, or JSONL / Parquet with --map)",
    "export": "export accepted preference pairs for TRL, or a rollout, group or fork tree as static HTML",
    "curate": "build preference pairs and review them (build, accept, reject, status)",
    "enrich": "fill in token ids, log-probs and entropy of imported rollouts with a policy",
    "backend": "serve a policy over HTTP with the OpenAI-compatible completions API",
}


def _err(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)


def _db_argument(ap: argparse.ArgumentParser) -> None:
    from studio.store import default_db_path

    ap.add_argument("--db", default=str(default_db_path()), help=f"the studio's DuckDB store (default {default_db_path()})")


def _open(db: str):
    from studio.store import Store

    return Store.open_existing(db)


# ------------------------------------------------------------------------------- generate

def _generate(argv: list[str]) -> int:
    from studio.runs.generation import BOUNDS, GenerateConfig

    ap = argparse.ArgumentParser(prog=f"{PROG} generate", description="Sample completions from a policy in a worker, "
                                 "score them with the task's rule (and the active rule version) and store them as a run.")
    _db_argument(ap)
    ap.add_argument("--policy", default=None, help="policy folder (default: the sample policy)")
    ap.add_argument("--prompt", action="append", default=[], help="a prompt, e.g. 'Q: 23+48-7=' (repeatable)")
    ap.add_argument("--prompts", type=Path, default=None, help="a file of prompts, one per line")
    ap.add_argument("--fresh", type=int, default=0, help="also draw this many new prompts from the task's generator")
    ap.add_argument("--difficulty", default="medium", help="difficulty of --fresh prompts (easy, medium, hard)")
    ap.add_argument("--task", default="arithmetic", help="the task the prompts belong to")
    ap.add_argument("--name", default=None, help="the run's name")
    for f, help_ in (("group_size", "completions per prompt (one GRPO group)"), ("temperature", "sampling temperature; 0 is greedy"),
                     ("top_p", "nucleus sampling mass"), ("max_new_tokens", "longest completion in tokens"),
                     ("seed", "sampler seed (same seed, prompts and policy: same rollouts)"),
                     ("top_k_stats", "most likely alternatives recorded per token")):
        default = getattr(GenerateConfig, f)
        lo_hi = f" ({BOUNDS[f][0]:g}-{BOUNDS[f][1]:g})" if f in BOUNDS else ""
        ap.add_argument("--" + f.replace("_", "-"), type=type(default), default=default,
                        help=f"{help_}{lo_hi}; default {default}")
    args = ap.parse_args(argv)

    from backends import PolicyLoadError
    from studio.runs.generation import ConfigError
    from studio.store import StoreError
    from studio.tasks import TaskParseError, UnknownTaskError, get_task

    try:
        prompts = list(args.prompt)
        if args.prompts:
            prompts += [line for line in args.prompts.read_text().splitlines() if line.strip()]
        if args.fresh:
            prompts += [p.text for p in get_task(args.task).make_prompts(args.fresh, seed=args.seed,
                                                                        difficulty=args.difficulty)]
        from studio.face import api

        s = api.Studio(_open(args.db), args.policy or _sample_policy())
    except (OSError, ValueError, StoreError, UnknownTaskError) as exc:
        _err(exc)
        return BAD_INPUT
    try:
        res = s.generate(prompts, group_size=args.group_size, temperature=args.temperature, top_p=args.top_p,
                         max_new_tokens=args.max_new_tokens, seed=args.seed, top_k_stats=args.top_k_stats,
                         task=args.task, name=args.name, progress=True)
    except (TaskParseError, ConfigError, PolicyLoadError, UnknownTaskError) as exc:
        _err(exc)
        return BAD_INPUT
    finally:
        s.close()
    where = f" on {res.device}" if res.device else ""
    print(f"{res.run_id}: {res.status}, {res.rollouts} rollouts stored{where}"
          + (f" ({res.error})" if res.error else ""))
    return OK if res.status == "done" else FAILED


def _sample_policy() -> str:
    from sample_data import POLICY_DIR

    return str(POLICY_DIR)


# ---------------------------------------------------------------------------------- score

def _score(argv: list[str], prog: str = f"{PROG} score") -> int:
    """``rollout-studio score`` (also ``python -m studio.rules``)."""
    ap = argparse.ArgumentParser(prog=prog, description="Re-score stored rollouts and store the result as a "
                                 "new rule version: a reward rule runs in the sandbox, a reward model in the worker.")
    _db_argument(ap)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--rule", help="a .py file or dotted module defining reward(prompt, completion, gold, steps, **ctx)")
    what.add_argument("--reward-model", type=Path, help="a sequence-classification reward-model folder")
    ap.add_argument("--name", default=None, help="the rule's name (default: the file or module name)")
    ap.add_argument("--note", default="", help="why this version (stored with it)")
    ap.add_argument("--run", default=None, help="only rollouts of this run id")
    args = ap.parse_args(argv)

    from backends import PolicyLoadError
    from studio.rewards.rules import RuleSourceError
    from studio.store import StoreError

    try:
        from studio.face import api

        s = api.Studio(_open(args.db), _sample_policy())
    except StoreError as exc:
        _err(exc)
        return BAD_INPUT
    try:
        res = s.score(args.rule, reward_model=args.reward_model, name=args.name, note=args.note, run=args.run)
    except (OSError, ValueError, RuleSourceError, PolicyLoadError) as exc:
        _err(exc)
        return BAD_INPUT
    finally:
        s.close()
    print(f"{res.rule_version_id}: {res.status}, {res.scored} scored, {res.failed} failed"
          + (f" ({res.message})" if res.message else ""))
    for rid, msg in res.errors:
        print(f"  {rid}: {msg}")
    return OK if res.status in ("done", "unchanged") and not res.failed else FAILED


# --------------------------------------------------------------------------------- export

def _export(argv: list[str]) -> int:
    from studio.curation import add_export_arguments, run_export

    ap = argparse.ArgumentParser(
        prog=f"{PROG} export",
        description="Write the accepted preference pairs in a TRL dataset format (with a provenance sidecar); or, "
                    "with --rollout, --group or --fork-tree, one self-contained HTML page of it that opens in any "
                    "browser without a server (hover cards included).")
    _db_argument(ap)
    add_export_arguments(ap)
    html = ap.add_argument_group("static HTML (instead of pairs)")
    one = html.add_mutually_exclusive_group()
    one.add_argument("--rollout", help="a rollout id: its token strip")
    one.add_argument("--group", help="a group id (or a prompt id: its newest group): every completion")
    one.add_argument("--fork-tree", help="a rollout id: its strip and its tree of branches")
    html.add_argument("--channel", default="entropy", choices=("entropy", "logprob", "advantage", "weight"),
                      help="what colours the tokens")
    args = ap.parse_args(argv)

    from studio.curation.export import NothingToExport, StalePairsError
    from studio.curation.pairs import CurationError
    from studio.store import StoreError

    try:
        store = _open(args.db)
    except StoreError as exc:
        _err(exc)
        return BAD_INPUT
    try:
        if args.rollout or args.group or args.fork_tree:
            from studio.face import api

            path = api.Studio(store, _sample_policy()).save_html(
                args.out, rollout=args.rollout, group=args.group, fork_tree=args.fork_tree, channel=args.channel)
            print(f"wrote {path}")
            return OK
        return run_export(store, args)
    except (NothingToExport, StalePairsError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return FAILED
    except (CurationError, StoreError, OSError) as exc:  # StudioAPIError is a ValueError like CurationError
        _err(exc)
        return BAD_INPUT
    except ValueError as exc:
        _err(exc)
        return BAD_INPUT
    finally:
        store.close()


# ----------------------------------------------------------------------------- delegation

def _serve(argv: list[str]) -> int:
    from studio.face import serve

    return serve.main(argv, prog=f"{PROG} serve")


def _import(argv: list[str]) -> int:
    from studio.ingest.importers import main

    return main(argv, prog=f"{PROG} import")


def _curate(argv: list[str]) -> int:
    from studio.curation import main

    return main(argv, prog=f"{PROG} curate")


def _enrich(argv: list[str]) -> int:
    from studio.runs.enrich import main

    return main(argv, prog=f"{PROG} enrich")


def _backend(argv: list[str]) -> int:
    from backends.server import main

    return main(argv)


HANDLERS = {"serve": _serve, "generate": _generate, "score": _score, "import": _import, "export": _export,
            "curate": _curate, "enrich": _enrich, "backend": _backend}


def main(argv: list[str] | None = None) -> int:
    """Run ``rollout-studio SUBCOMMAND …``; returns the exit code (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="Rollout Studio: see inside the rollouts of RL fine-tuning runs.",
                                 epilog="exit codes: 0 done · 1 ran but did not succeed · 2 bad input, nothing changed"
                                        " · 130 interrupted\n'rollout-studio SUBCOMMAND --help' for each one's options.")
    ap.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = ap.add_subparsers(dest="cmd", metavar="SUBCOMMAND", required=True)
    for name, help_ in COMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    if not argv or argv[0] not in HANDLERS:
        ap.parse_args(argv[:1] or argv)  # prints usage (exit 2) or --help / --version (exit 0)
        return BAD_INPUT
    problem = _db_problem(argv[1:])
    if problem:
        _err(problem)
        return BAD_INPUT
    try:
        return HANDLERS[argv[0]](argv[1:])
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED


def _db_problem(argv: list[str]) -> str | None:
    """Why a ``--db`` path cannot be a path at all (``~user/…`` for a user that does not exist:
    ``Path.expanduser`` raises RuntimeError, which every subcommand's store opening would let through)."""
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--db" and i + 1 < len(argv) else arg[5:] if arg.startswith("--db=") else None
        if value is not None:
            try:
                Path(value).expanduser()
            except RuntimeError as exc:
                return f"--db {value}: {exc}"
    return None


def _version() -> str:
    from studio import __version__

    return __version__


def entry() -> None:
    """The ``rollout-studio`` console script."""
    try:
        code = main()
    except SystemExit as exc:  # argparse's usage errors (2) and --help (0)
        code = exc.code if isinstance(exc.code, int) else BAD_INPUT
    sys.exit(code)


if __name__ == "__main__":
    entry()
