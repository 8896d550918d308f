"""Real servers for the shared-store tests: a PostgreSQL server and an S3-compatible one.

:func:`postgres_server` starts Debian's PostgreSQL in a fresh temporary data directory on a free
port of 127.0.0.1, with password (SCRAM) authentication for a created user and database;
:func:`s3_server` starts moto's S3-compatible server in this process on a free port, with a
bucket made. Both stop and clean up at exit. The pytest fixtures :func:`postgres` and :func:`s3`
(imported by ``tests/conftest.py``) share one of each per test session; a test that needs an
empty catalog takes :meth:`PostgresServer.new_database`, one that needs an empty data path a
fresh prefix of the bucket (:meth:`S3Server.data_path`).

Credentials travel as they do for a user: the password only in ``env`` (``PGPASSWORD``), never in
``url`` or ``conninfo``; the S3 keys only in ``env`` (``AWS_*``).

PostgreSQL's binaries are found on PATH (``initdb``) or in ``/usr/lib/postgresql/<newest>/bin``;
without them the fixture skips, except under CI (``CI=true``), where ``.ci/run`` installs them and a
missing server is a failure. ``initdb`` refuses to run as root, so as root the server runs as the
``postgres`` OS user (``runuser``), in a directory it owns.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_USER = "studio"
PG_DBNAME = "studio"
S3_REGION = "us-east-1"
S3_BUCKET = "rollouts"


class ServiceMissing(RuntimeError):
    """A server's programs are not installed on this machine."""


@dataclasses.dataclass(frozen=True)
class PostgresServer:
    """A running PostgreSQL server and one database on it, as a user would be told of them."""

    host: str
    port: int
    user: str
    password: str
    dbname: str
    bin_dir: Path
    """Where the server's programs are (``createdb`` for :meth:`new_database`)."""

    @property
    def url(self) -> str:
        """``postgresql://user@host:port/dbname``: the address, without the password."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.dbname}"

    @property
    def conninfo(self) -> str:
        """The libpq key/value string (``dbname=… host=… port=… user=…``), without the password."""
        return f"dbname={self.dbname} host={self.host} port={self.port} user={self.user}"

    @property
    def env(self) -> dict[str, str]:
        """The environment a client needs besides the address: libpq's ``PGPASSWORD``."""
        return {"PGPASSWORD": self.password}

    def new_database(self, name: str) -> PostgresServer:
        """Create an empty database ``name`` owned by :attr:`user`; the same server, pointed at it."""
        run = subprocess.run(
            [str(self.bin_dir / "createdb"), "-h", self.host, "-p", str(self.port), "-U", self.user, name],
            env={**os.environ, **self.env}, capture_output=True, text=True, check=False)
        if run.returncode:
            raise RuntimeError(f"createdb {name} failed: {run.stderr.strip()}")
        return dataclasses.replace(self, dbname=name)


@dataclasses.dataclass(frozen=True)
class S3Server:
    """A running S3-compatible server, its keys and a bucket on it."""

    endpoint_url: str
    """``http://127.0.0.1:PORT``."""
    region: str
    key_id: str
    secret: str
    bucket: str

    @property
    def endpoint(self) -> str:
        """``host:port``, as DuckDB's S3 secret wants its ``ENDPOINT``."""
        return self.endpoint_url.removeprefix("http://")

    @property
    def env(self) -> dict[str, str]:
        """The environment an S3 client reads: keys, endpoint and region."""
        return {"AWS_ACCESS_KEY_ID": self.key_id, "AWS_SECRET_ACCESS_KEY": self.secret,
                "AWS_ENDPOINT_URL": self.endpoint_url, "AWS_REGION": self.region}

    def data_path(self, prefix: str) -> str:
        """``s3://bucket/prefix/``: a data path of its own in the bucket."""
        return f"s3://{self.bucket}/{prefix.strip('/')}/"

    def client(self):
        """A boto3 S3 client for this server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region,
                            aws_access_key_id=self.key_id, aws_secret_access_key=self.secret)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def postgres_bin_dir() -> Path:
    """The directory of PostgreSQL's server programs (``initdb``, ``pg_ctl``, ``createdb``).

    Raises:
        ServiceMissing: neither PATH nor ``/usr/lib/postgresql/*/bin`` has ``initdb``.
    """
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                      key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if versions:
        return versions[-1].parent
    raise ServiceMissing("PostgreSQL is not installed (no initdb on PATH or in /usr/lib/postgresql/*/bin): "
                         "apt-get install postgresql")


def _as_server_user(argv: list[str]) -> list[str]:
    """``argv`` run as the ``postgres`` OS user when we are root (initdb and postgres refuse root)."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Start a PostgreSQL server in a temporary directory; stop it and remove the directory at exit.

    Raises:
        ServiceMissing: PostgreSQL is not installed.
    """
    bin_dir = postgres_bin_dir()
    password = secrets.token_urlsafe(16)
    root = Path(tempfile.mkdtemp(prefix="studio-pg-"))
    data, log = root / "data", root / "server.log"
    (root / "pwfile").write_text(password + "\n")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(root / "pwfile", "postgres", "postgres")
    started = False

    def server_cmd(*argv: str) -> None:
        run = subprocess.run(_as_server_user(list(argv)), cwd=root, capture_output=True, text=True,
                             env={**os.environ, "LC_ALL": "C"}, check=False)
        if run.returncode:
            detail = log.read_text() if log.exists() else ""
            raise RuntimeError(f"{Path(argv[0]).name} failed ({run.returncode}): {run.stderr.strip()}\n{detail}")

    try:
        server_cmd(str(bin_dir / "initdb"), "-D", str(data), "-U", PG_USER, f"--pwfile={root / 'pwfile'}",
                   "--auth=scram-sha-256", "--encoding=UTF8", "--no-locale", "--no-sync")
        port = free_port()
        # fsync off: the tests kill clients, never this server, so durability is not under test
        options = (f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={root} "
                   "-c fsync=off -c full_page_writes=off -c max_connections=200")
        server_cmd(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "start")
        started = True
        server = PostgresServer("127.0.0.1", port, PG_USER, password, "postgres", bin_dir)
        yield server.new_database(PG_DBNAME)
    finally:
        try:
            if started:
                server_cmd(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def s3_server() -> Iterator[S3Server]:
    """Start moto's S3-compatible server in this process with :data:`S3_BUCKET` made; stop it at exit.

    It serves on a free port of 127.0.0.1, so other processes on this machine reach it too.
    Moto keeps its buckets per process: two servers started by one process share them.
    """
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        server = S3Server(f"http://{host}:{port}", S3_REGION, "studio-test-key", secrets.token_hex(16), S3_BUCKET)
        server.client().create_bucket(Bucket=server.bucket)
        yield server
    finally:
        moto.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the test session (its database ``studio``).

    Without PostgreSQL installed the test is skipped, but fails under CI (``.ci/run`` installs it).
    """
    try:
        with postgres_server() as server:
            yield server
    except ServiceMissing as missing:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{missing} (under CI it must be there: .ci/run installs it)")
        pytest.skip(str(missing))


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """One real S3-compatible server (moto) for the test session, its bucket made."""
    with s3_server() as server:
        yield server
