"""The backend's HTTP face: tornado handlers for the routes of :mod:`.protocol`, Bearer auth,
the application and the serving loop.

JSON in and out; every refusal and failure in OpenAI's error shape (:class:`.ApiError`).
Every route but ``/health`` needs ``Authorization: Bearer KEY`` when the server has a key;
a server without one may bind only a loopback address (:func:`is_loopback`, checked by the
command line). Completions go through the :class:`.Batcher`, tokenizer-only routes run on
the engine's info thread, so none of them blocks the event loop.
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import signal
import sys

import tornado.web

from .engine import Batcher, Engine
from .protocol import ApiError, Completion, parse_completion, parse_ids

log = logging.getLogger("rollout_studio.backend")


class Handler(tornado.web.RequestHandler):
    """JSON in and out, OpenAI's error shape, Bearer auth on everything but ``/health``."""

    def initialize(self, engine: Engine, batcher: Batcher, api_key: str | None):
        self.engine, self.batcher, self.api_key = engine, batcher, api_key

    def prepare(self):
        if self.api_key and self.request.path != "/health":
            given = self.request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                self.fail(ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY' with the key "
                                        "the server was started with"))

    def body(self) -> object:
        try:
            return json.loads(self.request.body or b"null")
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON") from None

    def reply(self, obj: dict, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))

    def fail(self, err: ApiError) -> None:
        self.reply(err.body(), err.status)

    def write_error(self, status_code: int, **kwargs) -> None:  # tornado's own errors, same shape
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(ApiError(status_code, self._reason).body()))

    async def run(self, work) -> None:
        """Answer with ``await work()``; ApiErrors and failures in OpenAI's shape."""
        try:
            if self.engine.delay_s and self.request.path != "/health":
                await asyncio.sleep(self.engine.delay_s)
            self.reply(await work())
        except ApiError as exc:
            self.fail(exc)
        except Exception as exc:
            log.exception("request failed")
            self.fail(ApiError(500, f"{type(exc).__name__}: {exc}"))

    async def on_info_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.engine.info_thread, fn, *args)


class Completions(Handler):
    req: Completion | None = None

    async def post(self):
        async def work():
            self.req = parse_completion(self.body(), self.engine.name, self.engine.extension)
            return await self.batcher.submit(self.req)
        await self.run(work)

    def on_connection_close(self) -> None:
        if self.req is not None:
            self.req.abandoned = True


class Models(Handler):
    async def get(self):
        async def work():
            return {"object": "list", "data": [await self.on_info_thread(self.engine.card)]}
        await self.run(work)


class Health(Handler):
    async def get(self):
        self.reply({"status": "ok", "policy_loaded": self.engine.loaded, "model_calls": self.batcher.calls,
                    "requests": self.batcher.requests, "busy": self.batcher.running,
                    "waiting": len(self.batcher.waiting)})


class Tokenize(Handler):
    async def post(self):
        async def work():
            b = self.body()
            if not isinstance(b, dict) or not isinstance(b.get("prompt"), str):
                raise ApiError(400, "'prompt' must be a string", "prompt")
            if b.get("model") not in (None, self.engine.name):
                raise ApiError(404, f"The model `{b['model']}` does not exist.", "model")
            special = bool(b.get("add_special_tokens", True))
            ids = await self.on_info_thread(
                lambda: self.engine.tokenizer(b["prompt"], add_special_tokens=special)["input_ids"])
            return {"count": len(ids), "max_model_len": self.engine.max_model_len, "tokens": ids, "token_strs": None}
        await self.run(work)


class Detokenize(Handler):
    async def post(self):
        async def work():
            b = self.body()
            if not isinstance(b, dict):
                raise ApiError(400, "the request body must be a JSON object")
            ids = parse_ids(b.get("tokens"), "tokens")
            skip = bool(b.get("skip_special_tokens", False)) if self.engine.extension else False
            text = await self.on_info_thread(lambda: self.engine.tokenizer.decode(ids, skip_special_tokens=skip))
            return {"prompt": text}
        await self.run(work)


class Pieces(Handler):
    async def post(self):
        async def work():
            b = self.body()
            ids = parse_ids(b.get("tokens") if isinstance(b, dict) else None, "tokens")
            return {"pieces": await self.on_info_thread(self.engine.pieces, self.engine.tokenizer, ids)}
        await self.run(work)


class Reward(Handler):
    async def post(self):
        async def work():
            b = self.body()
            if not isinstance(b, dict):
                raise ApiError(400, "the request body must be a JSON object")
            ps, cs = b.get("prompt"), b.get("completion")
            if not (isinstance(ps, list) and isinstance(cs, list) and len(ps) == len(cs)
                    and all(isinstance(x, str) for x in ps + cs)):
                raise ApiError(400, "'prompt' and 'completion' must be lists of strings of the same length", "prompt")

            def score():
                rm = self.engine.reward_model()
                from ..reward_model import reward_model_version

                return rm, rm.score_rollouts(ps, cs), reward_model_version(rm.path)

            rm, scores, version = await asyncio.get_running_loop().run_in_executor(self.engine.model_thread, score)
            return {"object": "list", "model": rm.name, "version": version,
                    "data": [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(scores)]}
        await self.run(work)


class NotFound(Handler):
    def prepare(self):
        self.fail(ApiError(404, f"no such endpoint: {self.request.method} {self.request.path}"))


def make_app(engine: Engine, api_key: str | None = None) -> tornado.web.Application:
    """The tornado application serving ``engine`` (the extension's routes only when it is on)."""
    kw = {"engine": engine, "batcher": Batcher(engine), "api_key": api_key}
    routes = [(r"/v1/completions", Completions, kw), (r"/v1/models", Models, kw), (r"/health", Health, kw),
              (r"/tokenize", Tokenize, kw), (r"/detokenize", Detokenize, kw)]
    if engine.extension:
        routes += [(r"/studio/pieces", Pieces, kw), (r"/studio/reward", Reward, kw)]
    return tornado.web.Application(routes, default_handler_class=NotFound, default_handler_args=kw)


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine.

    >>> is_loopback("localhost"), is_loopback("::1"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def serve(engine: Engine, host: str, port: int, key: str | None) -> int:
    """Listen on ``host:port`` until SIGINT or SIGTERM; returns the exit code (1: cannot listen)."""
    app = make_app(engine, key)
    try:
        server = app.listen(port, address=host, xheaders=False)
    except OSError as exc:
        print(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    engine.info_thread.submit(engine.card)  # tokenizer and weights hash ready before the first client asks
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    shown = f"[{host}]" if ":" in host else host
    print(f"Rollout Studio backend on http://{shown}:{port}  (policy {engine.policy_path.name}"
          f"{f', reward model {engine.reward_path.name}' if engine.reward_path else ''}, device {engine.device}, "
          f"extension {'on' if engine.extension else 'off'}, {'API key required' if key else 'no API key'})",
          flush=True)
    await stop.wait()
    server.stop()
    engine.model_thread.shutdown(wait=False, cancel_futures=True)
    return 0
