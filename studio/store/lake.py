"""A shared store: DuckLake, a catalog in a database and the data as Parquet files.

Several processes (the served studio, a notebook, CLI imports, on one machine or many) open the
same shared store at once. It is named by

- a folder holding ``studio-store.json`` (made by :func:`create_shared`, or ``rollout-studio
  store create --shared PATH``): its ``catalog`` is ``sqlite:catalog.sqlite`` (one machine; the
  file inside the folder) or ``postgres:<libpq connection string>`` (a team), its ``data_path``
  a folder (relative to the store's folder, or absolute on a shared disk) or ``s3://bucket/prefix/``;
- or a ``postgresql://user@host:port/dbname`` URL: a team store whose data path its catalog keeps.

DuckDB opens it through the ``ducklake`` extension (with ``sqlite_scanner``, ``postgres_scanner``
and ``httpfs`` for the catalogs and object storage), loaded from the files the ``duckdb-extension-*``
packages install: nothing is downloaded. The lake is attached as :data:`LAKE` and each cursor
uses it (:func:`use`).

Credentials are never written into the folder's file or the catalog: PostgreSQL's come from libpq's
``PGPASSWORD`` or password file (``PGPASSFILE``, ``~/.pgpass``); object storage's from
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_ENDPOINT_URL`` / ``AWS_REGION`` or the JSON file
``$ROLLOUT_STUDIO_STORAGE_SECRETS`` with those keys.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import duckdb

from studio.store.errors import StoreError

LAKE = "lake"  # the name the lake is attached under
MARKER = "studio-store.json"
FORMAT = "rollout-studio-shared"
# rows an insert keeps in the catalog itself rather than in a new Parquet file: a mini-run step's or a
# rule's few rows would otherwise each leave a small file behind (``store compact`` merges what remains)
INLINE_ROWS = 1000
# rows per Parquet row group of the data files (DuckLake's default is 122,880): a point read (one
# rollout's tokens, a group's rewards) decodes one row group, and Parquet has no index finer than
# its row groups' min/max; 10k rows halved a token-strip click at 1M rollouts for ~6% more bytes
ROW_GROUP_ROWS = 10_240


class SharedStoreError(StoreError):
    """A shared store cannot be made, reached or opened; the message names it and what to do."""


@dataclass(frozen=True)
class LakeSpec:
    """Where a shared store's catalog and data are.

    ``catalog``: ``sqlite:<path>`` or ``postgres:<libpq conninfo>``; ``data_path``: a folder or an
    ``s3://`` prefix, absolute (None: the one the catalog keeps); ``name``: what messages call it.
    """

    catalog: str
    data_path: str | None
    name: str

    @property
    def on_s3(self) -> bool:
        return (self.data_path or "").startswith("s3://")


def is_shared(path: str | Path) -> bool:
    """True when ``path`` names a shared store (a folder with :data:`MARKER`, or a PostgreSQL URL)."""
    text = str(path)
    if text.startswith(("postgresql://", "postgres://")):
        return True
    return text != ":memory:" and (Path(text).expanduser() / MARKER).is_file()


def spec_of(path: str | Path) -> LakeSpec:
    """Read where the shared store at ``path`` keeps its catalog and data.

    Raises:
        SharedStoreError: the folder's file is unreadable, or the URL carries a password.
    """
    text = str(path)
    if text.startswith(("postgresql://", "postgres://")):
        return LakeSpec(f"postgres:{conninfo(text)}", None, redacted(text))
    folder = Path(text).expanduser().resolve()
    try:
        info = json.loads((folder / MARKER).read_text())
        if info.get("format") != FORMAT:
            raise ValueError(f"format is {info.get('format')!r}, not {FORMAT!r}")
        catalog, data = str(info["catalog"]), info.get("data_path")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SharedStoreError(f"{folder / MARKER} does not describe a shared store ({exc}); it was not "
                               "changed. Make one with `rollout-studio store create --shared PATH`.") from None
    if catalog.startswith("sqlite:"):
        catalog = f"sqlite:{_under(folder, catalog[len('sqlite:'):])}"
    if data and not data.startswith("s3://"):
        data = _under(folder, data)
    return LakeSpec(catalog, _slash(data) if data else None, str(folder))


def conninfo(url: str) -> str:
    """The libpq connection string of ``postgresql://user@host:port/dbname?opt=v`` (no password: the
    studio refuses one in a URL, where it would be shown and kept)."""
    parts = urlsplit(url)
    if parts.password is not None:
        raise SharedStoreError(
            f"{redacted(url)}: put the password in PGPASSWORD or a password file (PGPASSFILE, ~/.pgpass), "
            "not in the URL; the studio never stores or shows credentials.")
    items = {"dbname": unquote(parts.path.lstrip("/")) or None, "host": parts.hostname,
             "port": str(parts.port) if parts.port else None, "user": unquote(parts.username or "") or None}
    for pair in filter(None, parts.query.split("&")):
        key, _, value = pair.partition("=")
        if key.lower() in ("password", "passfile"):
            raise SharedStoreError(f"{redacted(url)}: credentials belong in the environment, not the URL")
        items[key] = unquote(value)
    return " ".join(f"{k}={v}" for k, v in items.items() if v)


def redacted(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


def _under(folder: Path, path: str) -> str:
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else folder / p)


def _slash(path: str) -> str:
    return path if path.endswith("/") else path + "/"


def create_shared(path: str | Path, catalog: str | None = None, data: str | None = None) -> Path:
    """Make an empty shared store folder at ``path`` (the tables are created by ``Store.open``).

    ``catalog``: None for a SQLite catalog inside the folder, or a ``postgresql://`` URL (its
    database must exist and hold no other DuckLake). ``data``: where the Parquet files go: None for
    ``data/`` inside the folder, a folder (shared disk), or ``s3://bucket/prefix``.

    Raises:
        SharedStoreError: ``path`` exists and is not an empty folder, or the URL carries a password.
    """
    folder = Path(path).expanduser().resolve()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise SharedStoreError(f"{folder} already exists and is not an empty folder; a shared store is made in a "
                               "new one (nothing was changed)")
    if catalog and catalog.startswith(("postgresql://", "postgres://")):
        cat = f"postgres:{conninfo(catalog)}"
    elif catalog in (None, "", "sqlite"):
        cat = "sqlite:catalog.sqlite"
    else:
        raise SharedStoreError(f"catalog {catalog!r}: give a postgresql://user@host:port/dbname URL, or none for "
                               "a SQLite catalog inside the store's folder")
    if data and not data.startswith("s3://"):
        data = str(Path(data).expanduser().resolve())
    folder.mkdir(parents=True, exist_ok=True)
    info = {"format": FORMAT, "catalog": cat, "data_path": _slash(data) if data else "data/"}
    (folder / MARKER).write_text(json.dumps(info, indent=2) + "\n")
    return folder


# -- connecting ------------------------------------------------------------------------------
_EXTENSIONS = {  # name DuckDB loads it under -> (python package, file it ships)
    "ducklake": ("duckdb_extension_ducklake", "ducklake"),
    "sqlite_scanner": ("duckdb_extension_sqlite", "sqlite"),
    "postgres_scanner": ("duckdb_extension_postgres_scanner", "postgres_scanner"),
    "httpfs": ("duckdb_extension_httpfs", "httpfs"),
}


def extension_file(name: str) -> Path:
    """The ``.duckdb_extension`` file of extension ``name`` for this DuckDB, from its package.

    DuckDB takes an extension's name from its file name: a package whose file is named otherwise
    (``sqlite``) is copied once under the name DuckDB expects.
    """
    import importlib

    package, stem = _EXTENSIONS[name]
    try:
        root = Path(importlib.import_module(package).__path__[0])
    except ImportError:
        raise SharedStoreError(f"the DuckDB extension package {package.replace('_', '-')} is not installed; "
                               f"install rollout-studio's dependencies (pip install -e .)") from None
    found = sorted(root.rglob(f"v{duckdb.__version__}/{stem}.duckdb_extension"))
    if not found:
        raise SharedStoreError(f"{package} has no {stem}.duckdb_extension for DuckDB {duckdb.__version__}; install the "
                               f"package version that matches duckdb=={duckdb.__version__}")
    if stem == name:
        return found[0]
    copy = Path(tempfile.gettempdir()) / f"rollout-studio-ext-{duckdb.__version__}" / f"{name}.duckdb_extension"
    if not copy.is_file() or copy.stat().st_size != found[0].stat().st_size:
        copy.parent.mkdir(parents=True, exist_ok=True)
        tmp = copy.with_suffix(f".{os.getpid()}")
        shutil.copyfile(found[0], tmp)
        tmp.replace(copy)
    return copy


def connect(spec: LakeSpec) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the shared store attached as :data:`LAKE` and in use.

    Raises:
        SharedStoreError: the catalog cannot be reached or refuses the credentials, or the data
            cannot be reached; the message names the store and what to do.
    """
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    try:
        con.execute(f"LOAD '{extension_file('ducklake')}'")
        if spec.catalog.startswith("sqlite:"):
            con.execute(f"LOAD '{extension_file('sqlite_scanner')}'")
            # DuckLake reads its catalog's small tables on every query: one thread per scan of them, not a
            # parallel scan's setup (6 ms a query, not 9, on the 2-core machine)
            con.execute("SET GLOBAL sqlite_disable_multithreaded_scans = true")
            _wal(Path(spec.catalog[len("sqlite:"):]))
        else:
            con.execute(f"LOAD '{extension_file('postgres_scanner')}'")
        if spec.on_s3 or (spec.data_path is None and s3_settings()):  # (a URL's store: its data may be on S3)
            con.execute(f"LOAD '{extension_file('httpfs')}'")
            _s3_secret(con)
        options = [f"DATA_INLINING_ROW_LIMIT {INLINE_ROWS}"]
        if spec.data_path:  # the folder's file says where the data is now (the store may have moved)
            options += [f"DATA_PATH {_lit(spec.data_path)}", "OVERRIDE_DATA_PATH true"]
        con.execute(f"ATTACH {_lit('ducklake:' + spec.catalog)} AS {LAKE} ({', '.join(options)})")
        con.execute(f"USE {LAKE}")
        con.execute("SET GLOBAL parquet_metadata_cache = true")
        return con
    except duckdb.Error as exc:
        con.close()
        raise SharedStoreError(explain(spec, exc)) from None


def use(cur: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Make ``cur`` (a new cursor: cursors do not inherit ``USE``) read and write the lake."""
    cur.execute(f"USE {LAKE}")
    return cur


def explain(spec: LakeSpec, exc: BaseException) -> str:
    """What a failure to reach or open the shared store ``spec`` means, and what to do."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    low = str(exc).lower()
    if "http" in low or (spec.on_s3 and "s3" in low):
        return (f"the data of shared store {spec.name} on {spec.data_path or 'object storage'} cannot be reached "
                f"({first}). Check AWS_ENDPOINT_URL and the credentials (AWS_ACCESS_KEY_ID, ...); nothing was "
                "changed.")
    if "password authentication failed" in low or "no password supplied" in low or "authentication" in low:
        return (f"the catalog of shared store {spec.name} refused the credentials ({first}). Set PGPASSWORD or a "
                "password file (PGPASSFILE, ~/.pgpass) for its user; nothing was changed.")
    if "connection refused" in low or "could not connect" in low or "could not translate host" in low or \
            "timeout expired" in low:
        return (f"the catalog of shared store {spec.name} cannot be reached ({first}). Check that the PostgreSQL "
                "server is running and the host and port are right; nothing was changed.")
    if "does not exist" in low and "database" in low:
        return (f"the catalog database of shared store {spec.name} does not exist ({first}). Create it first "
                "(createdb, or CREATE DATABASE as its owner); nothing was changed.")
    return f"shared store {spec.name} cannot be opened ({first}); nothing was changed."


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _wal(path: Path) -> None:
    """Put a SQLite catalog in WAL mode (made if missing): its readers then never block a writer's
    commit, and a reader sees every commit made before its query began.

    A catalog already in WAL mode (its header says so: bytes 18 and 19 are 2) is not opened here:
    Python's SQLite library closing the file would release the locks DuckDB's own SQLite holds on it
    in this process (POSIX locks are the whole process's), and another connection's reads would
    then fail ("database disk image is malformed")."""
    try:
        with open(path, "rb") as f:
            if f.read(20)[18:20] == b"\x02\x02":
                return
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, timeout=30)
    try:
        if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            con.execute("PRAGMA journal_mode=WAL")
    finally:
        con.close()


def s3_settings() -> dict[str, str]:
    """The object-storage settings of this process: ``$ROLLOUT_STUDIO_STORAGE_SECRETS`` (a JSON file) then
    the ``AWS_*`` environment variables, which win."""
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_REGION")
    out: dict[str, str] = {}
    file = os.environ.get("ROLLOUT_STUDIO_STORAGE_SECRETS")
    if file:
        try:
            out.update({k: str(v) for k, v in json.loads(Path(file).expanduser().read_text()).items() if k in keys})
        except (OSError, ValueError, AttributeError) as exc:
            raise SharedStoreError(f"ROLLOUT_STUDIO_STORAGE_SECRETS={file} is not a readable JSON file of {', '.join(keys)} "
                                   f"({exc})") from None
    out.update({k: os.environ[k] for k in keys if os.environ.get(k)})
    return out


def _s3_secret(con: duckdb.DuckDBPyConnection) -> None:
    """A temporary (in-memory, never written) DuckDB secret for object storage from :func:`s3_settings`."""
    s = s3_settings()
    opts = ["TYPE s3"]
    if s.get("AWS_ACCESS_KEY_ID"):
        opts += [f"KEY_ID {_lit(s['AWS_ACCESS_KEY_ID'])}", f"SECRET {_lit(s.get('AWS_SECRET_ACCESS_KEY', ''))}"]
    if s.get("AWS_SESSION_TOKEN"):
        opts.append(f"SESSION_TOKEN {_lit(s['AWS_SESSION_TOKEN'])}")
    opts.append(f"REGION {_lit(s.get('AWS_REGION', 'us-east-1'))}")
    endpoint = s.get("AWS_ENDPOINT_URL")
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        opts += [f"ENDPOINT {_lit(parts.netloc)}", "URL_STYLE 'path'",
                 f"USE_SSL {'true' if parts.scheme == 'https' else 'false'}"]
    con.execute(f"CREATE OR REPLACE TEMPORARY SECRET rollout_studio_s3 ({', '.join(opts)})")


def missing_data_files(con: duckdb.DuckDBPyConnection, spec: LakeSpec) -> tuple[list[tuple[str, Path]], int, Path]:
    """``(table, file)`` of each live data file the catalog lists that is not on disk, how many it
    lists, and the data folder (object storage is not checked file by file: a missing object fails
    the read that needs it)."""
    meta = f"__ducklake_metadata_{LAKE}"
    root = spec.data_path or kept_data_path(con) or ""
    if "://" in root:
        return [], 0, Path()
    rows = con.execute(
        f"""SELECT f.path, f.path_is_relative, t.table_name, t.path, t.path_is_relative, s.path, s.path_is_relative
            FROM {meta}.ducklake_data_file f JOIN {meta}.ducklake_table t USING (table_id)
            JOIN {meta}.ducklake_schema s USING (schema_id)
            WHERE f.end_snapshot IS NULL AND t.end_snapshot IS NULL""").fetchall()
    base = Path(root)
    missing = []
    for path, rel, table, tpath, trel, spath, srel in rows:
        here = Path(path)
        if rel:
            schema_dir = Path(spath or "") if not srel else base / (spath or "")
            here = (Path(tpath or "") if not trel else schema_dir / (tpath or "")) / path
        if not here.is_file():
            missing.append((table, here))
    return missing, len(rows), base


def kept_data_path(con: duckdb.DuckDBPyConnection) -> str | None:
    """The data path the attached lake's catalog keeps (where a store named by URL has its data)."""
    rows = con.execute(f"SELECT value FROM __ducklake_metadata_{LAKE}.ducklake_metadata "
                       "WHERE key = 'data_path'").fetchall()
    return rows[0][0] if rows else None


def token_inlining(con: duckdb.DuckDBPyConnection) -> str | None:
    """The most token rows a write keeps in the catalog of the lake attached to ``con`` (DuckLake's
    ``data_inlining_row_limit`` of ``token_rows``: "0" never, "" the lake's default); None where the
    lake has no token table."""
    from studio.store import schema

    if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND table_name = ?",
                       [LAKE, schema.TOKEN_ROWS]).fetchall()[0][0]:
        return None
    rows = con.execute(f"SELECT value FROM {LAKE}.options() WHERE option_name = 'data_inlining_row_limit' "
                       "AND scope = 'TABLE' AND scope_entry = ?", [f"main.{schema.TOKEN_ROWS}"]).fetchall()
    return rows[0][0] if rows else ""
