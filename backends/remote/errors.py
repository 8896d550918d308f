"""The errors of a remote backend: every failure is a :class:`RemoteError` (a
``PolicyLoadError``, so callers that show a policy's problems show these too) whose message
names the URL and what to do. The subclasses also derive from the built-in error a caller
would expect (``ConnectionError``, ``TimeoutError``, ``PermissionError``)."""
from __future__ import annotations

from ..types import PolicyLoadError


class RemoteError(PolicyLoadError):
    """A remote backend could not do what was asked; the message names the URL and what to do."""


class BackendUnavailable(RemoteError, ConnectionError):
    """Nothing answers at the URL, or the server closed the connection before answering."""


class BackendTimeout(RemoteError, TimeoutError):
    """The server did not answer within the timeout."""


class BackendAuthError(RemoteError, PermissionError):
    """The server refused the API key (HTTP 401 or 403)."""


class BackendRequestError(RemoteError):
    """The server refused the request as invalid (HTTP 4xx); its message is passed on."""


class BackendServerError(RemoteError):
    """The server failed while answering (HTTP 5xx)."""


class ExtensionRequired(RemoteError):
    """The feature needs the rollout-studio extension, which this server (plain vLLM/SGLang) lacks."""


class IncompatibleBackend(RemoteError):
    """The server answers, but not with what the studio needs (not JSON, no token ids)."""

