"""Serving the studio: ``python launch.py``, ``rollout-studio serve``, ``panel serve launch.py``.

With no arguments it serves the embedded default at http://127.0.0.1:5006: a DuckDB store
seeded with the sample rollouts, and the sample policy for Generate. Binds 127.0.0.1 and
refuses any other address without basic auth or OAuth.

How a served studio holds under load and faults (kept true with the code):

- ``launch.py`` binds 127.0.0.1 by default and refuses other addresses without basic auth
  or OAuth. On loopback only loopback origins may open the websocket; on other addresses
  (always authenticated) any origin may, since users reach it by host names we cannot know.
- With ``--admins`` (authentication required) only those users get code-running actions:
  ``create_app`` does not build the Generate panel for anyone else's session
  (``studio.face.app.may_run_code``), the fork panel gets no branch form and registers no
  branch callback, and the comparison's *Score* button has no callback, so no callback
  exists to call.
- A page is built for what it shows first. The lower tabs other than *Group view* are built
  the first time they are opened (``create_app``'s ``view(i)``, under ``pn.io.hold(freeze=True)``)
  and then kept; views with ``shown`` (``widgets/base/lazy.py``) draw only while their tab is open.
  (Not Panel's ``dynamic`` tabs, which re-create a tab's models on every switch.) A served page
  costs about a second of server CPU on the 2-core machine: ``create_app`` (~0.3 s), Bokeh models
  (``StudioTemplate`` puts them on the document with its model graph frozen: walked once, not per
  root), and the document sent over the websocket (~0.2 s). Nothing on it grows with the
  store: the table holds one page (cut in DuckDB) and the group picker the groups of that page,
  so a page of the 1M-rollout store builds in ~1.1 s of CPU, as one of the 512-rollout sample
  store does (it took ~7 s when the table held its first 5,000 rows and the picker every group).
- A click that opens a rollout reads first, off the event loop, then shows
  (``widgets.base.preload.Preloading.select``): each view registers a *preloader* (``widgets.base.preload.Preloading.add_preloader``) that
  does its store reads for the new selection on one of four shared threads (``studio-preload``),
  and the token strip and the group view draw their HTML there too; when they are done the state
  changes under ``pn.io.hold()`` (every view's change in one websocket message) and each view's
  redraw finds its reads and HTML (``widgets.base.preload.Preloading.preloaded``, keyed by what they depend on: the
  strip's by every state value it shows, ``token_strip.SHOWN``; a miss reads and draws in place, so
  a view never shows other data than it asked for). The event loop, which serves every page of
  the process, answers other sessions meanwhile and only sets the drawn HTML: DuckDB lets go of
  the GIL while it reads. A later click in the same page replaces one still reading. Reads past
  their time limit are interrupted by one watchdog thread (``studio.store._Watchdog``), woken only when a
  read's deadline is the earliest (not once per read: hundreds a second under load).
  The token strip reads ``queries.credit.rollout_view`` (its group scored once, which the group view draws
  from when the group changes: no second read); the group view redraws from its cached cards when
  the group is the same (cards are drawn once per group and channel); the fork panel reads
  ``queries.forks.lineage`` (one read) and draws the tree only when the rollout has a parent or branches;
  *Save as HTML* names its file when pressed. Hidden tabs do nothing. New rows from a Generate go
  the same way (``widgets.base.preload.Preloading.stored``): the table's rows (made into the frame it shows), run
  labels, reward bounds, the group picker's groups, the strip and the group are read on the
  thread, and so is every other read a ``refresh`` redraws from (the store's counts, policies,
  rule versions, credit sources, sample prompts: ``widgets.base.preload.Preloading.fresh_read``, a preloader that runs
  only after new rows); then ``refresh`` is bumped and the event loop only sets widgets (the run
  picker's options only when they changed). A group's tokens are read with the ids' range as a
  first filter (``queries.tokens_of``): a group's ids are made together, so the scan drops most
  rows before the semi join hashes them.
  The Generate itself scores and stores each chunk on a thread (``asyncio.to_thread``), and a
  fork's branches are stored the same way, so other pages' clicks are answered during the write.
  Outside a served page (a notebook, a test) ``select`` changes the state at once.
- Folder tailers are followed by one task per server process (``follow_tails``: every 2 s, one
  count per store), which refreshes only the pages whose store grew: not a periodic callback per
  page.
- Widgets built after the page (a tab opened, a plot added) get their stylesheets from this
  server (Panel takes ``dist_url`` from the session's document); plots update existing
  ``HoloViews`` panes rather than creating new ones in callbacks. Nothing may come from the
  network: the UI tests fail on any failed request, and one opens every tab and fails on any
  request that leaves loopback.
- Worker processes watch their owner and exit when it is gone (a SIGKILLed server
  cannot shut its pool down). A server stopped by Ctrl-C or SIGTERM stops its live mini-runs (with a
  checkpoint) and shuts its pool down (``stop_workers``); workers ignore SIGINT (their owner stops them). They run below the server's priority
  (``backends.device.yield_to_server``, niceness ``ROLLOUT_STUDIO_WORKER_NICE``, default 10):
  sampling, rules and training wait for pages when the cores are contended.
- Session ids are signed (``studio.face.serve.main``: ``pn.serve(sign_sessions=True)``, a key made per start): a request that
  names its own session id gets 403, so no one can pick or reuse another page's session.
- The server process never imports torch: models load in the worker.
- One store per server process, shared by all sessions; each session has its own
  ``StudioState``. Long work (sampling) runs in the worker pool and is awaited by an async
  callback, so the Tornado loop keeps serving.
- The backend (``backends/server/``) binds 127.0.0.1 by default and refuses any other address
  without an API key (Bearer, compared in constant time; ``/health`` alone is open). Its model work
  runs on one thread and its tokenizer endpoints on another, so health checks answer during a
  long generation. The studio never stores or shows a key: it comes from
  ``ROLLOUT_STUDIO_API_KEY`` (or ``launch.py --api-key``, which sets it for the workers), and URLs
  with credentials are refused. Every remote call has a timeout (5 s for health checks, 120 s or
  ``ROLLOUT_STUDIO_REMOTE_TIMEOUT`` for model requests), and the owner asks a backend only off the
  event loop (``asyncio.to_thread``), except the hover card's token texts (at most 1 s, then ``#id``
  for 30 s).
- In a notebook the ``Studio`` object is the owner of its store: the served studio and a notebook
  cannot hold the same file at once (DuckDB), and ``studio.open`` says so. A shared store
  (``--db`` a shared store's folder or a ``postgresql://`` URL) they open together, with CLI
  imports and mini-runs beside them; the pages pick up the others' commits (``follow_tails``).
- Every model or user string is rendered through ``widgets.base.style.esc`` into HTML panes;
  Tabulator's plaintext formatter escapes table cells. No Markdown pane shows user text.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import signal
import sys
import webbrowser
from pathlib import Path

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_loopback(address: str) -> bool:
    if address in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def websocket_origins(address: str, port: int) -> list[str]:
    """Origins allowed to open the app's websocket.

    On loopback: the loopback names (IPv6 literals in brackets). Elsewhere authentication is
    mandatory, and users reach the server by host names we cannot know, so any origin.
    """
    if not is_loopback(address):
        return ["*"]
    hosts = sorted({"localhost", "127.0.0.1", address})
    return [f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h in hosts]


def unauthenticated_exposure(argv: list[str]) -> str | None:
    """For ``panel serve launch.py``: why its command line would expose the studio, or None.

    Panel's own ``--address`` decides where it listens, and without it Bokeh listens on
    every interface; so without ``--basic-auth`` or ``--oauth-provider`` an explicit
    loopback ``--address`` is required, as ``python launch.py`` binds by default.
    """
    address = None
    for i, arg in enumerate(argv):
        if arg == "--address" and i + 1 < len(argv):
            address = argv[i + 1]
        elif arg.startswith("--address="):
            address = arg.split("=", 1)[1]
    authed = any(a.split("=")[0] in ("--basic-auth", "--oauth-provider") for a in argv)
    if authed or (address is not None and is_loopback(address)):
        return None
    where = address or "every interface (panel serve's default without --address)"
    return (f"refusing to serve on {where} without authentication: the studio runs code and trains "
            "models. Run `panel serve launch.py --address 127.0.0.1`, or add --basic-auth or --oauth-provider.")


def can_show() -> bool:
    """Whether opening the user's browser makes sense (a display, a registered browser)."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return False
    try:
        webbrowser.get()
    except webbrowser.Error:
        return False
    return True


def build_parser(prog: str = "launch.py") -> argparse.ArgumentParser:
    from studio.store import default_db_path

    ap = argparse.ArgumentParser(prog=prog, description="Serve Rollout Studio.")
    # a str, not a Path: a team store's postgresql://user@host/db URL would lose its "//" in a Path
    ap.add_argument("--db", default=None,
                    help="the store: a DuckDB file, created and seeded with sample rollouts if missing (default "
                         f"{default_db_path()}); a shared store's folder (`rollout-studio store create --shared`), "
                         "whose tables are made and seeded if its catalog is empty; or a team catalog's "
                         "postgresql://user@host:port/db URL (password from PGPASSWORD or ~/.pgpass)")
    ap.add_argument("--policy", default=None,
                    help="policy for Generate and Branch: a folder, or a backend URL such as http://gpu-box:8000 "
                         "(`rollout-studio backend`, vLLM, SGLang); default: the sample policy")
    ap.add_argument("--api-key", default=None,
                    help="API key of a backend URL (default $ROLLOUT_STUDIO_API_KEY); never stored or shown")
    ap.add_argument("--port", type=int, default=5006, help="port to listen on (default 5006)")
    ap.add_argument("--address", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1); any other needs --basic-auth or --oauth-provider")
    ap.add_argument("--basic-auth", default=None,
                    help='password, or a JSON file mapping users to passwords ({"alice": "..."}) (Panel basic auth)')
    ap.add_argument("--oauth-provider", default=None, help="Panel OAuth provider (with PANEL_OAUTH_* settings)")
    ap.add_argument("--cookie-secret", default=None, help="cookie secret for authentication (random if omitted)")
    ap.add_argument("--admins", default=None,
                    help="comma-separated users allowed to run code (Generate); others only browse. Needs authentication")
    ap.add_argument("--no-show", action="store_true", help="do not open a browser")
    ap.add_argument("--check", action="store_true", help="build the app headless, report, and exit")
    return ap


def parse_args(argv: list[str] | None = None, prog: str = "launch.py") -> argparse.Namespace:
    ap = build_parser(prog)
    args = ap.parse_args(argv)
    if not 0 < args.port < 65536:
        ap.error(f"--port must be 1-65535, got {args.port}")
    if args.admins is not None and not (args.basic_auth or args.oauth_provider):
        ap.error("--admins needs authentication to know who is who: add --basic-auth FILE.json or --oauth-provider")
    return args


def admin_set(value: str | None) -> frozenset[str] | None:
    """``"alice, bob"`` -> {"alice", "bob"}; None means everyone may run code."""
    if value is None:
        return None
    return frozenset(name.strip() for name in value.split(",") if name.strip())


def serving_diagnostics() -> None:
    """Bokeh's expensive error diagnostics off in a served studio (unless
    ``BOKEH_PERFORM_ERROR_DIAGNOSTICS`` says otherwise): a signature check of every callback
    registered as a page is built, and close-match suggestions worked out for every attribute
    lookup that fails, which Panel's custom components do on each update (~2% of the server's
    time with twenty pages open). Errors are still raised, with shorter messages."""
    if "BOKEH_PERFORM_ERROR_DIAGNOSTICS" not in os.environ:
        from bokeh.settings import settings

        settings.perform_error_diagnostics.set_value(False)


def main(argv: list[str] | None = None, prog: str = "launch.py") -> int:
    args = parse_args(argv, prog)
    if not is_loopback(args.address) and not (args.basic_auth or args.oauth_provider):
        print(f"error: refusing to listen on {args.address} without authentication: the studio runs code and "
              "trains models. Add --basic-auth PASSWORD (or a file of user:password lines), or --oauth-provider, "
              "or keep the default --address 127.0.0.1.", file=sys.stderr)
        return 2

    import panel as pn

    from backends import PolicyLoadError, check_policy_folder, is_policy_url
    from sample_data import POLICY_DIR, SEED_DIRS
    from studio.face.app import create_app
    from studio.store import Store, StoreError, default_db_path

    db = args.db or default_db_path()
    try:
        store = Store.open(db, seed_dir=SEED_DIRS)
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    store.prepare()  # a shared store's mirror made while the server starts, not on the first page
    if args.api_key:  # workers inherit it; it is never written to the store or the page
        os.environ["ROLLOUT_STUDIO_API_KEY"] = args.api_key
    try:
        if args.policy and is_policy_url(args.policy):
            from backends.remote import normalize_url

            policy = normalize_url(args.policy)
        else:
            policy = Path(args.policy or POLICY_DIR).expanduser().resolve()
            check_policy_folder(policy)
    except PolicyLoadError as exc:
        print(f"error: --policy: {exc}", file=sys.stderr)
        return 2
    if isinstance(policy, str):  # a backend that is down is not fatal: the page says so, with a Retry
        from backends.remote import RemoteError, remote_info

        try:
            info = remote_info(policy)
            print(f"backend {policy}: {info.model} on {info.device or 'a device it does not report'}"
                  f"{'' if info.extension else ' (plain server: entropy estimated, no branching)'}", flush=True)
        except RemoteError as exc:
            print(f"warning: --policy: {exc}", file=sys.stderr)

    admins = admin_set(args.admins)
    if args.check:
        app = create_app(db, policy, store=store, admins=admins)
        app.server_doc()  # builds every Bokeh model, as a browser session would
        c = store.counts()
        print(f"ok: {store.describe()} ({c['rollouts']} rollouts, {c['tokens']} tokens, {c['runs']} runs); "
              f"policy {policy}")
        store.close()
        return 0

    show = not args.no_show and can_show()
    auth = {}
    if args.basic_auth:
        auth.update(basic_auth=args.basic_auth, cookie_secret=args.cookie_secret or os.urandom(24).hex())
    if args.oauth_provider:
        auth.update(oauth_provider=args.oauth_provider, cookie_secret=args.cookie_secret or os.urandom(24).hex())
    print(f"Rollout Studio on http://{args.address}:{args.port}  ({store.describe()}, policy {policy})", flush=True)
    serving_diagnostics()
    # Signed session ids (a key made per start): a page's session id is one this server made, never one
    # a request names (which would let a client pick, or guess, another person's session; a blank one
    # made Bokeh answer 500). A request naming its own id gets 403.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        pn.serve({"/": lambda: create_app(db, policy, store=store, admins=admins)}, port=args.port,
                 address=args.address, websocket_origin=websocket_origins(args.address, args.port), show=show,
                 title="Rollout Studio", threaded=False, sign_sessions=True, secret_key=secrets.token_urlsafe(32),
                 **auth)
    except KeyboardInterrupt:  # Ctrl-C: the way to stop a server, not an error
        print("Rollout Studio stopped", flush=True)
    finally:
        stop_workers()
    return 0


def _exit_on_sigterm(signum, frame) -> None:
    """SIGTERM ends the server as Ctrl-C does: through :func:`stop_workers`, not mid-write.

    Serving, it stops the event loop (``pn.serve`` then returns): an exception raised here would
    land in whatever callback runs at that moment, and a wrapper that catches everything (a
    Generate writing its rows, say) would swallow it and leave the server running."""
    import asyncio

    try:
        loop = asyncio.get_running_loop()  # the handler runs in the main thread, inside the loop's run
    except RuntimeError:  # not serving yet
        raise SystemExit(0) from None
    loop.call_soon_threadsafe(loop.stop)


def stop_workers() -> None:
    """The server is exiting: live mini-runs stop with a checkpoint, the worker pool is shut
    down and its queues closed, so nothing is left running and nothing is printed at exit
    (a killed process leaves its semaphores behind, which Python reports as leaked)."""
    from studio import workers
    from studio.runs import minirun

    minirun.stop_all()
    workers.shutdown()


def served_by_panel() -> None:
    """``panel serve launch.py``: settings come from ROLLOUT_STUDIO_DB / ROLLOUT_STUDIO_POLICY /
    ROLLOUT_STUDIO_ADMINS; the page refuses to build on an unauthenticated non-loopback bind."""
    from studio.face.app import create_app, refusal_page

    problem = unauthenticated_exposure(sys.orig_argv)  # Bokeh rewrites sys.argv for the app
    serving_diagnostics()
    if problem:
        refusal_page(problem).servable()
    else:
        create_app(os.environ.get("ROLLOUT_STUDIO_DB"), os.environ.get("ROLLOUT_STUDIO_POLICY"),
                   admins=admin_set(os.environ.get("ROLLOUT_STUDIO_ADMINS"))).servable()
