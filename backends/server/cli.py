"""``rollout-studio backend`` / ``python -m backends.server``: the options, their checks, and
the start of the server.

    rollout-studio backend --policy PATH [--reward-model PATH] [--port 8000] [--host ADDR --api-key KEY]

Exit codes: 0 stopped by SIGINT/SIGTERM, 1 cannot listen on the address, 2 bad options (a
non-loopback ``--host`` without a key, a port out of range, a folder that is no policy).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from ..device import PRECISIONS
from ..types import PolicyLoadError, check_policy_folder
from .engine import Engine
from .http import is_loopback, serve

ENV_KEY = "ROLLOUT_STUDIO_API_KEY"


def build_parser() -> argparse.ArgumentParser:
    """The command line's options (``--help`` lists them)."""
    ap = argparse.ArgumentParser(
        prog="rollout-studio backend",
        description="Serve a policy over HTTP with the OpenAI completions API (as vLLM implements it) and the "
                    "studio's extension (full-vocabulary entropy, fork branching). Point the studio at "
                    "http://HOST:PORT as its policy.")
    ap.add_argument("--policy", metavar="PATH", required=True,
                    help="policy folder (transformers causal LM), or 'sample'")
    ap.add_argument("--reward-model", metavar="PATH", default=None,
                    help="reward-model folder served at POST /studio/reward")
    ap.add_argument("--port", metavar="N", type=int, default=8000, help="port to listen on (default 8000)")
    ap.add_argument("--host", metavar="ADDR", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1); any other needs --api-key")
    ap.add_argument("--api-key", metavar="KEY", default=None,
                    help=f"key clients must send as 'Authorization: Bearer KEY' (default ${ENV_KEY})")
    ap.add_argument("--served-model-name", metavar="NAME", default=None,
                    help="model name in the API (default the folder's name)")
    ap.add_argument("--no-extension", action="store_true",
                    help="answer like a plain vLLM server: standard fields only, no /studio routes")
    ap.add_argument("--precision", default="auto", choices=PRECISIONS,
                    help="dtype the policy is loaded in (default auto: float32 on a CPU, the checkpoint's own on a "
                         "GPU); /v1/models reports it as the engine")
    ap.add_argument("--delay", metavar="S", type=float, default=0.0,
                    help="answer every request but /health this many seconds late (for testing timeouts)")
    return ap


def _folder(arg: str) -> Path:
    if arg == "sample":
        from sample_data import POLICY_DIR
        return POLICY_DIR
    return Path(arg).expanduser().resolve()


def main(argv: list[str] | None = None) -> int:
    """``rollout-studio backend``; returns the exit code."""
    args = build_parser().parse_args(argv)
    key = args.api_key or os.environ.get(ENV_KEY) or None
    if not is_loopback(args.host) and not key:
        print(f"error: refusing to listen on {args.host} without an API key: anyone who reaches the port could run "
              f"the model. Add --api-key KEY (or set {ENV_KEY}) and give the studio the same key, or keep the default "
              "--host 127.0.0.1 and reach it through a tunnel (ssh -L 8000:127.0.0.1:8000 gpu-box).", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"error: --port must be 1-65535, got {args.port}", file=sys.stderr)
        return 2
    policy = _folder(args.policy)
    reward = Path(args.reward_model).expanduser().resolve() if args.reward_model else None
    try:
        check_policy_folder(policy)
        if reward is not None:
            check_policy_folder(reward)
    except PolicyLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = Engine(policy, reward, args.served_model_name, extension=not args.no_extension, delay_s=args.delay,
                    precision=args.precision)
    if engine.device == "cpu":
        import torch

        from ..device import cpu_threads

        torch.set_num_threads(cpu_threads())  # one core stays with the HTTP loop
    return asyncio.run(serve(engine, args.host, args.port, key))
