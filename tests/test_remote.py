"""Remote backends end to end: the studio's own server on loopback (real HTTP, a subprocess
running the real sample policy) against the in-process backend, the OpenAI response
schema, degraded mode (the extension off), timeouts, a killed server, keys and binds."""
from __future__ import annotations

import json
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from backends.remote import (
    BackendAuthError,
    BackendTimeout,
    BackendUnavailable,
    ExtensionRequired,
    RemotePolicy,
    entropy_bounds,
    normalize_url,
)
from backends.types import PolicyLoadError
from sample_data import POLICY_DIR, REWARD_MODEL_DIR
from tests.fixtures import DEVICE, Backend

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Q: 23+48-7=", "Q: 5-9=", "Q: 61+7+30-44="]

# -- the OpenAI legacy completions response, from its documented fields and types ------------------
LOGPROBS = {"type": ["object", "null"], "required": ["tokens", "token_logprobs", "top_logprobs", "text_offset"],
            "additionalProperties": False, "properties": {
                "tokens": {"type": "array", "items": {"type": "string"}},
                "token_logprobs": {"type": "array", "items": {"type": ["number", "null"]}},
                "top_logprobs": {"type": "array", "items": {"type": ["object", "null"],
                                                            "additionalProperties": {"type": "number"}}},
                "text_offset": {"type": "array", "items": {"type": "integer", "minimum": 0}}}}
STUDIO_CHOICE = {"type": "object", "required": ["token_ids", "token_texts", "logprobs", "entropies", "topk_ids",
                                                "topk_logprobs", "text", "finish_reason", "start"], "properties": {
    "token_ids": {"type": "array", "items": {"type": "integer"}},
    "token_texts": {"type": "array", "items": {"type": "string"}},
    "logprobs": {"type": "array", "items": {"type": "number"}},
    "entropies": {"type": "array", "items": {"type": "number", "minimum": 0}},
    "topk_ids": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
    "topk_logprobs": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
    "text": {"type": "string"}, "finish_reason": {"enum": ["stop", "length"]}, "start": {"type": "integer"}}}
COMPLETION = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"], "properties": {
        "id": {"type": "string"}, "object": {"const": "text_completion"}, "created": {"type": "integer"},
        "model": {"type": "string"}, "system_fingerprint": {"type": ["string", "null"]},
        "choices": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["index", "text", "logprobs", "finish_reason"], "properties": {
                "index": {"type": "integer", "minimum": 0}, "text": {"type": "string"}, "logprobs": LOGPROBS,
                "finish_reason": {"enum": ["stop", "length", "content_filter", None]}, "studio": STUDIO_CHOICE}}},
        "usage": {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
                  "properties": {k: {"type": "integer", "minimum": 0}
                                 for k in ("prompt_tokens", "completion_tokens", "total_tokens")}}}}
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]},
        "code": {"type": ["string", "integer", "null"]}}}}}
MODELS = {"type": "object", "required": ["object", "data"], "properties": {
    "object": {"const": "list"}, "data": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["id", "object", "created", "owned_by"],
        "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                       "owned_by": {"type": "string"}}}}}}


@pytest.fixture(scope="module")
def local():
    """The in-process backend on the device the server picks (CUDA on a GPU machine, so the
    same tests then compare the GPU backend with the GPU in-process one)."""
    from backends import load_policy

    return load_policy(POLICY_DIR, device=DEVICE)


@pytest.fixture(autouse=True)
def _no_key_in_env(monkeypatch):
    monkeypatch.delenv("ROLLOUT_STUDIO_API_KEY", raising=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    b = Backend(tmp_path_factory.mktemp("remote"), "--reward-model", str(REWARD_MODEL_DIR))
    yield b
    b.stop()


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    b = Backend(tmp_path_factory.mktemp("plain"), "--no-extension")
    yield b
    b.stop()


def post(url: str, path: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def assert_same(remote, local, exact_entropy: bool = True, finish: bool = True) -> None:
    assert len(remote) == len(local)
    for r, g in zip(remote, local):
        assert (r.prompt_index, r.sample_idx, r.prompt) == (g.prompt_index, g.sample_idx, g.prompt)
        assert r.token_ids.tolist() == g.token_ids.tolist() and r.token_texts == g.token_texts
        assert not finish or r.finish_reason == g.finish_reason
        np.testing.assert_allclose(r.logprobs, g.logprobs, atol=2e-4)
        np.testing.assert_allclose(r.topk_logprobs, g.topk_logprobs, atol=2e-4)
        assert r.topk_ids.shape == g.topk_ids.shape
        assert r.n_tokens == 0 or (r.topk_ids == g.topk_ids).mean() > 0.99  # ids differ only where alternatives tie
        if exact_entropy:
            assert r.text == g.text and not r.entropy_estimate
            np.testing.assert_allclose(r.entropies, g.entropies, atol=2e-4)


# -- the extension: the same numbers as the local backend ------------------------------------------

def test_sampling_through_http_equals_the_local_backend(server, local):
    remote = RemotePolicy(server.url)
    assert remote.device == f"remote {server.url} ({DEVICE})" and remote.name == "policy"
    assert remote.version.startswith(f"{server.url}#policy@")
    for kw in (dict(n=3, temperature=1.0, max_new_tokens=30, seed=11),
               dict(n=2, temperature=0.7, top_p=0.9, max_new_tokens=20, seed=4, top_k_stats=3)):
        assert_same(remote.sample(PROMPTS, **kw), local.sample(PROMPTS, **kw))


def test_teacher_forced_scoring_equals_the_local_backend(server, local):
    gens = local.sample(PROMPTS, n=2, max_new_tokens=24, seed=3)
    prompts, comps = [g.prompt for g in gens], [g.token_ids.tolist() for g in gens]
    comps[0] = []  # an empty completion scores to nothing
    assert_same(RemotePolicy(server.url).score(prompts, comps), local.score(prompts, comps))
    texts = ["12;31-7=24", " 5"]  # text completions are tokenized without special tokens, as locally
    assert_same(RemotePolicy(server.url).score(PROMPTS[:2], texts), local.score(PROMPTS[:2], texts))


def test_fork_branching_through_the_extension_equals_the_local_backend(server, local):
    parent = local.sample(PROMPTS[:1], n=1, max_new_tokens=30, seed=2)[0]
    prefix, alt = parent.token_ids[:5].tolist(), int(parent.topk_ids[5][1])
    kw = dict(n=2, max_new_tokens=30, seed=9)
    assert_same(RemotePolicy(server.url).branch(PROMPTS[0], prefix, [alt, None], **kw),
                local.branch(PROMPTS[0], prefix, [alt, None], **kw))


def test_reward_model_scores_equal_the_local_reward_model(server):
    from backends.reward_model import load_reward_model

    prompts, comps = ["Q: 2+3=", "Q: 2+3="], ["2+3=5;A5", "2+3=7;A7"]
    want = load_reward_model(REWARD_MODEL_DIR, device="cpu").score_rollouts(prompts, comps)
    np.testing.assert_allclose(RemotePolicy(server.url).reward(prompts, comps), want, atol=1e-5)


# -- the standard API: shapes as OpenAI documents them -----------------------------------------------

def test_responses_follow_the_openai_completions_schema(server, local):
    url = server.url
    status, body = post(url, "/v1/completions", {"model": "policy", "prompt": PROMPTS[:2], "n": 2, "max_tokens": 12,
                                                 "logprobs": 3, "seed": 1})
    assert status == 200
    jsonschema.validate(body, COMPLETION)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]  # prompt-major
    for c in body["choices"]:
        lp = c["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
        assert all(3 <= len(d) <= 4 for d in lp["top_logprobs"])  # top 3, plus the chosen token when outside them
        assert lp["text_offset"] == sorted(lp["text_offset"]) and "".join(lp["tokens"]).startswith(c["text"])
    u = body["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["completion_tokens"] == sum(len(c["logprobs"]["tokens"]) for c in body["choices"])

    # a token-id prompt, tokens as ids, extension fields: the same draw as the text prompt
    ids = local.tokenizer(PROMPTS[0])["input_ids"]
    by_text = post(url, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 10, "seed": 5, "logprobs": 1,
                                            "studio": {"stats": True, "top_k": 2}})[1]
    by_ids = post(url, "/v1/completions", {"prompt": ids, "max_tokens": 10, "seed": 5, "logprobs": 1,
                                           "return_tokens_as_token_ids": True, "studio": {"stats": True, "top_k": 2}})[1]
    jsonschema.validate(by_ids, COMPLETION)
    s = by_ids["choices"][0]["studio"]
    assert s["token_ids"] == by_text["choices"][0]["studio"]["token_ids"]
    assert by_ids["choices"][0]["logprobs"]["tokens"] == [f"token_id:{i}" for i in s["token_ids"]]
    assert len(s["topk_ids"][0]) == 2 and len(s["entropies"]) == len(s["token_ids"])

    # echo with max_tokens 0: the prompt's tokens, the first one's logprob null (teacher forcing)
    status, echo = post(url, "/v1/completions", {"prompt": PROMPTS[0], "echo": True, "max_tokens": 0, "logprobs": 2})
    jsonschema.validate(echo, COMPLETION)
    lp = echo["choices"][0]["logprobs"]
    assert echo["choices"][0]["text"] == PROMPTS[0] and len(lp["tokens"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    want = local.score([PROMPTS[0][:1]], [ids[1:]])[0].logprobs  # (the sample tokenizer is per character)
    np.testing.assert_allclose(lp["token_logprobs"][1:], want, atol=2e-4)
    # echo and generate: prompt tokens, then the sampled ones
    both = post(url, "/v1/completions", {"prompt": PROMPTS[0], "echo": True, "max_tokens": 5, "logprobs": 1,
                                         "seed": 0})[1]
    jsonschema.validate(both, COMPLETION)
    assert both["choices"][0]["text"].startswith(PROMPTS[0])
    assert len(both["choices"][0]["logprobs"]["tokens"]) == len(ids) + both["usage"]["completion_tokens"]

    models = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=10).read())
    jsonschema.validate(models, MODELS)
    assert models["data"][0]["studio"]["vocab_size"] == 99
    status, tok = post(url, "/tokenize", {"model": "policy", "prompt": PROMPTS[0]})
    assert status == 200 and tok["tokens"] == ids and tok["count"] == len(ids)
    assert post(url, "/detokenize", {"tokens": ids})[1]["prompt"] == local.tokenizer.decode(ids)


@pytest.mark.parametrize("body, status, param", [
    ({"prompt": "Q: 1+1=", "stream": True}, 400, "stream"),  # streaming is refused, clearly
    ({"prompt": "Q: 1+1=", "model": "gpt-4"}, 404, "model"),
    ({"prompt": [], "max_tokens": 4}, 400, "prompt"),
    ({"prompt": "Q: 1+1=", "max_tokens": 0}, 400, "max_tokens"),  # 0 only with echo
    ({"prompt": "Q: 1+1=", "n": "two"}, 400, "n"),
    ({"prompt": "Q: 1+1=", "stop": [";"]}, 400, "stop"),
    ({"prompt": "Q: 1+1=", "logprobs": 50}, 400, "logprobs"),
    ({"prompt": [5, 6, 1000]}, 400, "prompt"),  # outside the vocabulary
    ({"prompt": "Q: 1+1=", "max_tokens": 500}, 400, "max_tokens"),  # past the model's 96 positions
    ({"prompt": "Q: 1+1=", "max_tokens": 3, "studio": {"prefix": [22, 15, 23], "choices": [5]}}, 400, "max_tokens"),
])
def test_bad_requests_get_openai_errors(server, body, status, param):
    got, err = post(server.url, "/v1/completions", body)
    assert got == status
    jsonschema.validate(err, ERROR)
    assert err["error"]["param"] == param and err["error"]["code"] == status


def until(ok, timeout_s: float = 30.0) -> bool:
    """Poll ``ok`` every 10 ms until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ok():
            return True
        time.sleep(0.01)
    return False


def test_waiting_requests_share_a_call_and_seeded_ones_run_alone(server, local):
    """While one call runs, unseeded requests with equal settings queue and then run as one
    sample_batch call; seeded requests run alone and get what they get alone."""
    url = server.url
    post(url, "/v1/completions", {"prompt": "Q: 1+1=", "max_tokens": 2})  # loaded
    h0 = server.health()
    results: dict[int, dict] = {}

    def send(i: int, body: dict) -> None:
        results[i] = post(url, "/v1/completions", body)[1]

    busy = threading.Thread(target=send, args=(0, {"prompt": PROMPTS, "n": 80, "max_tokens": 70, "seed": 1}))
    busy.start()
    assert until(lambda: (h := server.health())["busy"] and h["waiting"] == 0)  # the long call is in the model
    small = [threading.Thread(target=send, args=(i, {"prompt": PROMPTS[i % 3], "n": 2, "max_tokens": 8}))
             for i in (1, 2, 3)]
    seeded = [threading.Thread(target=send, args=(i, {"prompt": PROMPTS[i % 3], "n": 2, "max_tokens": 8, "seed": i,
                                                      "studio": {"stats": True}})) for i in (4, 5)]
    for t in small + seeded:
        t.start()
    queued = until(lambda: server.health()["waiting"] == 5 or not busy.is_alive())
    assert busy.is_alive() and queued, "the five requests did not all queue while the long call ran"
    for t in [busy] + small + seeded:
        t.join()
    h1 = server.health()
    assert h1["requests"] - h0["requests"] == 6
    assert h1["model_calls"] - h0["model_calls"] == 4  # the long one, the three small together, two seeded
    assert all(len(results[i]["choices"]) == 2 for i in range(1, 6))
    for i in (4, 5):  # batching never changes a seeded request's tokens
        alone = local.sample([PROMPTS[i % 3]], n=2, max_new_tokens=8, seed=i)
        assert [c["studio"]["token_ids"] for c in results[i]["choices"]] == [g.token_ids.tolist() for g in alone]


# -- degraded mode: a plain server (the extension off) ------------------------------------------------

def test_a_plain_server_gives_estimated_entropies_within_the_documented_bound(plain, local):
    remote = RemotePolicy(plain.url)
    info = remote.info()
    assert not info.extension and info.version == f"{plain.url}#policy@entropy-est-top20"
    assert remote.device == f"remote {plain.url} (device not reported)"
    kw = dict(n=2, max_new_tokens=24, seed=7)
    got, true = remote.sample(PROMPTS, **kw), local.sample(PROMPTS, **kw)
    assert_same(got, true, exact_entropy=False)  # ids, logprobs, top-k: standard fields are exact
    assert all(g.entropy_estimate for g in got) and [g.text for g in got] == [g.text for g in true]
    # the estimate is the documented lower bound: never above the true entropy, and the true
    # entropy is under the upper bound computed from the same top-20 (V = 99)
    raw = post(plain.url, "/v1/completions", {"prompt": PROMPTS, "n": 2, "max_tokens": 24, "seed": 7, "logprobs": 20,
                                              "return_tokens_as_token_ids": True})[1]
    jsonschema.validate(raw, COMPLETION)
    assert "studio" not in raw["choices"][0]
    for c, g, t in zip(raw["choices"], got, true):
        top = [[v for v in d.values()] + [-np.inf] * (21 - len(d)) for d in c["logprobs"]["top_logprobs"]]
        lo, hi = entropy_bounds(top, vocab_size=99, k=20)
        np.testing.assert_allclose(g.entropies, lo, atol=1e-5)
        assert (lo <= t.entropies + 1e-4).all() and (t.entropies <= hi + 1e-4).all()
    # scoring works with standard echo; entropies are estimates again
    comps = [g.token_ids.tolist() for g in true[:3]]
    scored, want = remote.score([g.prompt for g in true[:3]], comps), local.score([g.prompt for g in true[:3]], comps)
    assert_same(scored, want, exact_entropy=False, finish=False)  # (a plain server does not name its end token)
    assert all((s.entropies <= w.entropies + 1e-4).all() and s.entropy_estimate for s, w in zip(scored, want))


def test_a_plain_server_refuses_branching_naming_the_extension(plain):
    with pytest.raises(ExtensionRequired, match=r"branching needs the rollout-studio extension .*'studio.prefix'"):
        RemotePolicy(plain.url).branch(PROMPTS[0], [22, 15], [None], n=1, max_new_tokens=10)
    assert post(plain.url, "/studio/pieces", {"tokens": [5]})[0] == 404


# -- the studio against a URL ----------------------------------------------------------------------

def test_generate_branch_score_and_enrich_with_a_url_policy(server, plain, local, tmp_path):
    from studio import queries, workers
    from studio.runs.branch import BranchConfig, NoPolicyError, branch_sync
    from studio.runs.compare import score_with_sync
    from studio.runs.generation import GenerateConfig, generate_sync
    from studio.store import Store

    store = Store.open(tmp_path / "r.duckdb")
    try:
        cfg = GenerateConfig(group_size=2, seed=1, max_new_tokens=24)
        res = generate_sync(store, server.url + "/v1", PROMPTS[:2], cfg)
        assert res.status == "done" and res.rollouts == 4 and res.device == f"remote {server.url} ({DEVICE})"
        run = store.df("SELECT policy, name, config FROM runs WHERE run_id = ?", [res.run_id]).iloc[0]
        backend = json.loads(run.config)["backend"]
        assert run.policy == server.url and backend["extension"] and backend["entropy"] == "full distribution"
        assert "key" not in run.config.lower()
        ros = store.df("SELECT rollout_id, policy_version FROM rollouts ORDER BY rollout_id")
        assert ros["policy_version"].str.startswith(f"{server.url}#policy@").all()
        want = local.sample(PROMPTS[:2], n=2, max_new_tokens=24, seed=1)  # chunk 0's seed is config.seed
        got = [queries.tokens(store, r)["token_id"].tolist() for r in ros["rollout_id"]]
        assert sorted(got) == sorted(g.token_ids.tolist() for g in want)

        rid = ros["rollout_id"].iloc[0]
        br = branch_sync(store, rid, 3, [None], BranchConfig(n=2, seed=5))
        assert br.status == "done" and br.rollouts == 2, br.error
        version = score_with_sync(store, server.url, [rid])
        assert version.startswith(f"{server.url}#policy@")

        # a plain server: entropy marked as estimated in the run; branching it asks for another policy
        res2 = generate_sync(store, plain.url, PROMPTS[:1], cfg)
        run2 = store.df("SELECT name, config FROM runs WHERE run_id = ?", [res2.run_id]).iloc[0]
        assert res2.status == "done" and "entropy estimated" in run2["name"]
        assert json.loads(run2.config)["backend"]["entropy"].startswith("estimate: lower bound from the top-20")
        rid2 = store.scalar("SELECT rollout_id FROM rollouts WHERE run_id = ? LIMIT 1", [res2.run_id])
        n_runs = store.counts()["runs"]
        with pytest.raises(NoPolicyError, match="plain OpenAI-compatible server"):
            branch_sync(store, rid2, 2, [None], BranchConfig(n=1))
        assert store.counts()["runs"] == n_runs  # nothing written
    finally:
        store.close()
    # enrichment's worker job: the remote tokenizer reads text completions as the local one does
    comps, expect, stopped = ["12;31-7=24", "5;A-4"], [None, None], [True, False]
    got = workers.enrich_job(server.url, PROMPTS[:2], comps, expect, stopped)
    here = workers.enrich_job(str(POLICY_DIR), PROMPTS[:2], comps, expect, stopped)
    assert_same(got[0], here[0])
    assert got[1] == f"{server.url}#{here[1]}"


# -- failures: each one a documented error, never a hang ----------------------------------------------

def test_keys_timeouts_and_a_killed_server(tmp_path):
    b = Backend(tmp_path, "--api-key", "s3cret", "--delay", "3")
    try:
        assert b.health()["status"] == "ok"  # health needs no key
        with pytest.raises(BackendAuthError, match="needs an API key: set the server's key in ROLLOUT_STUDIO_API_KEY") as e:
            RemotePolicy(b.url, api_key="").sample(["Q: 1+1="])
        assert isinstance(e.value, PermissionError) and isinstance(e.value, PolicyLoadError)
        with pytest.raises(BackendAuthError, match="not the one it was started with") as e:
            RemotePolicy(b.url, api_key="n0t-th3-key").sample(["Q: 1+1="])
        assert "n0t-th3-key" not in str(e.value) and "s3cret" not in str(e.value)
        status, err = post(b.url, "/v1/completions", {"prompt": "Q: 1+1="}, key="wrong")
        assert status == 401
        jsonschema.validate(err, ERROR)

        with pytest.raises(BackendTimeout, match=rf"{re.escape(b.url)} did not answer /v1/models within 1 s") as e:
            RemotePolicy(b.url, api_key="s3cret", timeout=1).sample(["Q: 1+1="])
        assert isinstance(e.value, TimeoutError) and "ROLLOUT_STUDIO_REMOTE_TIMEOUT" in str(e.value)

        # killed while a request is in flight: the connection closes before an answer
        client = RemotePolicy(b.url, api_key="s3cret", timeout=30)
        caught: list[BaseException] = []
        t = threading.Thread(target=lambda: caught.append(_raises(lambda: client._call("GET", "/v1/models"))))
        t.start()
        time.sleep(1.0)
        b.stop(signal.SIGKILL)
        t.join(timeout=30)
        assert isinstance(caught[0], BackendUnavailable) and "closed the connection" in str(caught[0])
        # and down: nothing answers at the URL
        with pytest.raises(BackendUnavailable, match=rf"no backend answers at {re.escape(b.url)} \(connection refused\)") as e:
            client.sample(["Q: 1+1="])
        assert isinstance(e.value, ConnectionError) and "rollout-studio backend --policy" in str(e.value)
    finally:
        b.stop(signal.SIGKILL)


def _raises(fn) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 (handed back to the test thread)
        return exc
    return None


def test_a_non_loopback_bind_without_a_key_is_refused(monkeypatch, capsys):
    from backends import server

    monkeypatch.delenv("ROLLOUT_STUDIO_API_KEY", raising=False)
    assert server.main(["--policy", "sample", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "refusing to listen on 0.0.0.0 without an API key" in err and "--api-key" in err
    assert server.is_loopback("127.0.0.1") and server.is_loopback("::1") and not server.is_loopback("10.0.0.5")


# -- the pieces, on literal cases ------------------------------------------------------------------

@pytest.mark.parametrize("top, V, k, lower, upper", [
    # the tail is one token: both bounds are the exact entropy (0.5, 0.25, 0.25)
    ([np.log(0.5), np.log(0.25)], 3, None, 1.0397208, 1.0397208),
    # top 2 of a uniform 4: the tail (0.5) fills two tokens of 0.25 at least, and at most: log 4 exactly
    ([np.log(0.25)] * 2, 4, None, np.log(4), np.log(4)),
    # p = 0.9, r = 0.1 < p: lower = -0.9 ln 0.9 - 0.1 ln 0.1; upper spreads 0.1 over 1000 tokens
    ([np.log(0.9)], 1001, None, 0.0948245 + 0.2302585, 0.0948245 + 0.1 * np.log(1e4)),
    # V unknown: no upper bound
    ([np.log(0.6), np.log(0.3)], None, None, 0.3064954 + 0.3611918 + 0.2302585, np.inf),
    # the sampled token (0.05) listed beyond the top 1: the cap on the tail stays the top-1's 0.6
    ([np.log(0.6), np.log(0.05)], None, 1, 0.3064954 + 0.1497866 + 0.3674377, np.inf),
])
def test_entropy_bounds_on_literal_cases(top, V, k, lower, upper):
    lo, hi = entropy_bounds([top], vocab_size=V, k=k)
    assert lo[0] == pytest.approx(lower, abs=1e-6)
    assert hi[0] == pytest.approx(upper, abs=1e-6)


def test_backend_urls_are_normalized_and_never_carry_credentials():
    assert normalize_url("http://gpu-box:8000/v1/") == "http://gpu-box:8000"
    assert normalize_url("HTTPS://Host/rs/") == "https://host/rs"
    with pytest.raises(PolicyLoadError, match="ROLLOUT_STUDIO_API_KEY"):
        normalize_url("http://me:secret@gpu-box:8000")
    with pytest.raises(PolicyLoadError, match="not a backend URL"):
        normalize_url("ftp://gpu-box")
