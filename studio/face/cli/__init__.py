"""``rollout-studio``: the studio's command line.

    rollout-studio serve     [--db PATH] [--policy PATH] [--port N] …   the studio in a browser
    rollout-studio generate  --prompt 'Q: 23+48-7=' [--fresh N] …      sample, score and store
    rollout-studio score     --rule FILE.py | --reward-model FOLDER    re-score stored rollouts
    rollout-studio import    PATH… [--format F] [--skip-bad] [--tail]  a training run's rollouts
    rollout-studio export    --out pairs.jsonl | --out r.html --rollout ID   TRL data or static HTML
    rollout-studio curate    build|accept|reject|status …               preference pairs
    rollout-studio enrich    --policy FOLDER [--run ID]                 fill in missing token stats
    rollout-studio rescore   --policy P [--precision D] (--run ID | --rollout ID…)   recomputed log-probs
    rollout-studio minirun   [--steps N] [--resume RUN_ID] …            retrain the policy (a mini-run)
    rollout-studio backend   --policy PATH [--port N] …                 a policy over HTTP (OpenAI API)
    rollout-studio task      add NAME FILE… [--preset P] | list | show NAME   prompt sets as tasks
    rollout-studio store     create --shared PATH | copy SRC DST | info | compact   the store itself

One module per subcommand (``studio/face/cli/<name>.py``, each with ``main(argv, prog)``); the
documented older names ``python -m studio.rules|importers|enrich|minirun|curation`` run the same
modules. Every user-facing error is a :class:`studio.errors.StudioError` carrying its exit code;
:func:`~studio.face.cli.common.command` maps what a command's ``main`` raises to its exit code.

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
import importlib
import sys

from studio.face.cli.common import BAD_INPUT, PROG, _db_problem, _err

# name -> (module under studio.face.cli, one-line help)
COMMANDS = {
    "serve": ("serve", "serve the studio in a browser (127.0.0.1 unless given authentication)"),
    "generate": ("generate", "sample completions from a policy, score and store them"),
    "score": ("score", "re-score stored rollouts with a reward rule or a reward model (a new rule version)"),
    "import": ("import_", "import a training run's rollouts (TRL, verl, OpenRLHF, or JSONL / Parquet with --map)"),
    "export": ("export", "export accepted preference pairs for TRL, or a rollout, group or fork tree as static HTML"),
    "curate": ("curate", "build preference pairs and review them (build, accept, reject, status, export)"),
    "enrich": ("enrich", "fill in token ids, log-probs and entropy of imported rollouts with a policy"),
    "rescore": ("rescore", "teacher-force stored rollouts through a policy in a chosen precision (recomputed "
                           "log-probs, for the training-inference mismatch)"),
    "minirun": ("minirun", "retrain the policy with a mini-run and store every step"),
    "backend": ("backend", "serve a policy over HTTP with the OpenAI-compatible completions API"),
    "task": ("task", "bring a prompt set (JSONL, Parquet, CSV, a datasets folder) as a task; list and show tasks"),
    "store": ("store", "make a shared store, copy a store between a file and a shared one, show or compact one"),
}


def run(command: str, argv: list[str], prog: str | None = None) -> int:
    """Run one subcommand (its ``main`` maps what it raises to an exit code: ``common.command``)."""
    module = importlib.import_module(f"studio.face.cli.{COMMANDS[command][0]}")
    return module.main(argv, prog or f"{PROG} {command}")


def main(argv: list[str] | None = None) -> int:
    """Run ``rollout-studio SUBCOMMAND …``; returns the exit code (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="Rollout Studio: see inside the rollouts of RL fine-tuning runs.",
                                 epilog="exit codes: 0 done · 1 ran but did not succeed · 2 bad input, nothing changed"
                                        " · 130 interrupted\n'rollout-studio SUBCOMMAND --help' for each one's options.")
    ap.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = ap.add_subparsers(dest="cmd", metavar="SUBCOMMAND", required=True)
    for name, (_, help_) in COMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    if not argv or argv[0] not in COMMANDS:
        ap.parse_args(argv[:1] or argv)  # prints usage (exit 2) or --help / --version (exit 0)
        return BAD_INPUT
    problem = _db_problem(argv[1:])
    if problem:
        _err(problem)
        return BAD_INPUT
    return run(argv[0], argv[1:])


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
