"""Remote policies: a backend on another machine, reached over the OpenAI completions API.

``RemotePolicy(url)`` has the methods and return types of ``backends.policy.Policy``
(``sample``, ``branch``, ``score``, ``tokenizer``, ``device``, ``name``), so a worker job
runs a URL exactly as it runs a folder (``load_policy`` dispatches). Torch-free: numpy and
the standard library only.

Two kinds of server:
- ``rollout-studio backend`` (``backends.server``) offers the studio extension: exact
  full-vocabulary entropies with token ids and top-k in one response, forced-prefix
  continuation for fork branching, teacher forcing of given completion ids. Results equal
  the local backend's for the same seed and settings.
- a plain OpenAI-compatible server (vLLM, SGLang) offers only standard fields. Sampling and
  scoring still work: token ids come from vLLM's ``return_tokens_as_token_ids``, and each
  token's entropy is *estimated* from its top-``ESTIMATE_TOP_K`` logprobs
  (:func:`entropy_bounds`); every ``Generation`` says so (``entropy_estimate``) and the
  policy version carries the mark (``…@entropy-est-top20``). Branching needs the
  extension and is refused (:class:`ExtensionRequired`).

Every failure is a :class:`RemoteError` (a ``PolicyLoadError``, so callers that show a
policy's problems show these too) whose message names the URL and what to do.

One module per job: :mod:`.policy` (``RemotePolicy``, ``BackendInfo``, ``load_remote``,
``remote_info``), :mod:`.tokenizer` (``RemoteTokenizer``), :mod:`.generations` (choices →
``Generation``, exact or estimated; ``entropy_bounds``), :mod:`.transport` (one JSON
request, ``normalize_url``), :mod:`.errors` (the ``RemoteError`` family).
"""
from .errors import (
    BackendAuthError,
    BackendRequestError,
    BackendServerError,
    BackendTimeout,
    BackendUnavailable,
    ExtensionRequired,
    IncompatibleBackend,
    RemoteError,
)
from .generations import ESTIMATE_TOP_K, entropy_bounds
from .policy import CHUNK, INFO_TTL_S, BackendInfo, RemotePolicy, load_remote, remote_info
from .tokenizer import RemoteTokenizer
from .transport import DEFAULT_TIMEOUT_S, ENV_KEY, ENV_TIMEOUT, HEALTH_TIMEOUT_S, normalize_url

__all__ = ["CHUNK", "DEFAULT_TIMEOUT_S", "ENV_KEY", "ENV_TIMEOUT", "ESTIMATE_TOP_K", "HEALTH_TIMEOUT_S", "INFO_TTL_S",
           "BackendAuthError", "BackendInfo", "BackendRequestError", "BackendServerError", "BackendTimeout",
           "BackendUnavailable", "ExtensionRequired", "IncompatibleBackend", "RemoteError", "RemotePolicy",
           "RemoteTokenizer", "entropy_bounds", "load_remote", "normalize_url", "remote_info"]
