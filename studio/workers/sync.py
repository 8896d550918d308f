"""The studio's coroutines (generate, branch, apply a rule, …) run from synchronous code."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor


def run_sync(coro_fn, *args, **kwargs):
    """Run the coroutine function ``coro_fn(*args, **kwargs)`` from synchronous code:
    scripts, and notebooks (whose event loop is already running, so it runs on a helper
    thread instead)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_fn(*args, **kwargs))
    with ThreadPoolExecutor(max_workers=1) as ex:
        return ex.submit(asyncio.run, coro_fn(*args, **kwargs)).result()
