"""Requests to a remote backend: its URL's normal form, and one JSON request over HTTP whose
every failure becomes a typed :class:`.RemoteError` naming the URL and what to do.

The API key travels only in the ``Authorization`` header: it is never part of a URL, stored
or shown (:func:`normalize_url` refuses a URL that carries credentials). Standard library only.
"""
from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.parse
import urllib.request

from ..types import PolicyLoadError
from .errors import (
    BackendAuthError,
    BackendRequestError,
    BackendServerError,
    BackendTimeout,
    BackendUnavailable,
    IncompatibleBackend,
    RemoteError,
)

ENV_KEY = "ROLLOUT_STUDIO_API_KEY"  # the API key, never stored or shown
ENV_TIMEOUT = "ROLLOUT_STUDIO_REMOTE_TIMEOUT"  # seconds a model request may take (default DEFAULT_TIMEOUT_S)
DEFAULT_TIMEOUT_S = 120.0
HEALTH_TIMEOUT_S = 5.0


def normalize_url(url: str) -> str:
    """The base URL of a backend: scheme, host, port and path prefix, no trailing ``/`` or ``/v1``.

    >>> normalize_url("http://gpu-box:8000/v1/")
    'http://gpu-box:8000'

    Raises:
        PolicyLoadError: not an http(s) URL, or it carries credentials, a query or a fragment.
    """
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise PolicyLoadError(f"{url!r} is not a backend URL: expected http://HOST:PORT or https://HOST[:PORT][/PATH]")
    if parts.username or parts.password:
        raise PolicyLoadError(f"the backend URL for {parts.hostname} carries credentials: remove them from the URL "
                              f"and set the API key in {ENV_KEY} (or pass --api-key), so it is never stored")
    if parts.query or parts.fragment:
        raise PolicyLoadError(f"the backend URL {url!r} has a query or fragment: give only http(s)://HOST:PORT[/PATH]")
    try:
        port = parts.port
    except ValueError:
        raise PolicyLoadError(f"the backend URL {url!r} has an invalid port") from None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme.lower()}://{host}{f':{port}' if port else ''}{path}"


def request_json(url: str, key: str | None, method: str, path: str, body: dict | None, timeout: float) -> dict:
    """One JSON request to the backend at ``url`` (normalized), ``key`` sent as Bearer.

    Raises:
        RemoteError: the subclass that says what went wrong (unavailable, timeout, auth,
            request, server, not JSON); its message names the URL and what to do.
    """
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raise _http_error(exc, url, path, key) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise _timeout_error(url, path, timeout) from None
        raise BackendUnavailable(
            f"no backend answers at {url} ({_reason(exc.reason)}). Start it on the GPU machine with "
            "`rollout-studio backend --policy PATH --port N` (or check the address, and that the port is "
            "reachable, e.g. through `ssh -L`), then retry") from None
    except TimeoutError:
        raise _timeout_error(url, path, timeout) from None
    except (http.client.HTTPException, OSError) as exc:
        raise BackendUnavailable(
            f"the backend at {url} closed the connection before answering {path} ({_reason(exc)}): it "
            "stopped or crashed. Check its log, restart it, then retry") from None
    try:
        return json.loads(raw)
    except ValueError:
        raise IncompatibleBackend(f"{url}{path} answered with something that is not JSON: "
                                  "is this an OpenAI-compatible server?") from None


def _timeout_error(url: str, path: str, t: float) -> BackendTimeout:
    return BackendTimeout(f"the backend at {url} did not answer {path} within {t:g} s: it is busy or stuck. "
                          f"Retry, or allow longer with {ENV_TIMEOUT} (seconds)")


def _http_error(exc: urllib.error.HTTPError, url: str, path: str, key: str | None) -> RemoteError:
    try:
        raw = exc.read()
    except (OSError, http.client.HTTPException):
        raw = b""
    msg = _error_message(raw) or exc.reason or "no message"
    if exc.code in (401, 403):
        what = "it needs an API key: set" if not key else "the key sent is not the one it was started with: set"
        return BackendAuthError(f"the backend at {url} refused {path} ({exc.code}: {msg}); {what} the server's "
                                f"key in {ENV_KEY} (or pass --api-key) and retry")
    if exc.code >= 500:
        return BackendServerError(f"the backend at {url} failed on {path} ({exc.code}): {msg}. "
                                  "See the server's log; retry once it is fixed")
    return BackendRequestError(f"the backend at {url} refused {path} ({exc.code}): {msg}")


def _reason(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    return str(reason) or type(reason).__name__


def _error_message(raw: bytes) -> str:
    """The message of an error body: OpenAI's ``{"error": {"message"}}``, vLLM's older flat
    ``{"message"}``, FastAPI's ``{"detail"}``, or the text itself."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace").strip()[:300]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])
    return str(body)[:300]
