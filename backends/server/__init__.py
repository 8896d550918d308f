"""Serve a policy over HTTP: the OpenAI completions API as vLLM implements it, plus the studio's extension.

    rollout-studio backend --policy PATH [--reward-model PATH] [--port 8000] [--host ADDR --api-key KEY]
    python -m backends.server ...   (the same)

One module per job:

- :mod:`.protocol`: the endpoints' request and response shapes, ``parse_completion``
  (a body → a validated :class:`Completion`), OpenAI-shaped :class:`ApiError`.
- :mod:`.engine`: :class:`Engine` (the policy and reward model, loaded on first use; the
  model thread and the tokenizer thread) and :class:`Batcher` (merges waiting requests).
- :mod:`.http`: the tornado handlers, Bearer auth, :func:`make_app`, :func:`serve`.
- :mod:`.cli`: the options and their checks (:func:`main`, :func:`build_parser`); a
  non-loopback bind without an API key is refused.
"""
from .cli import ENV_KEY, build_parser, main
from .engine import Batcher, Engine
from .http import is_loopback, make_app, serve
from .protocol import MAX_LOGPROBS, MAX_ROWS, UNSUPPORTED, ApiError, Completion, parse_completion, parse_ids

__all__ = ["ENV_KEY", "MAX_LOGPROBS", "MAX_ROWS", "UNSUPPORTED", "ApiError", "Batcher", "Completion", "Engine",
           "build_parser", "is_loopback", "main", "make_app", "parse_completion", "parse_ids", "serve"]
