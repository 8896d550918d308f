"""Policy backend statistics checked against a direct softmax of the model's logits."""
import shutil

import numpy as np
import pytest
import torch

from backends import Policy, PolicyLoadError, load_policy, sample_batch, score_batch
from sample_data import POLICY_DIR

PROMPTS = ["Q: 23+48-7=", "Q: 5-9=", "Q: 61+7+30-44="]


def direct_stats(model, tokenizer, prompt: str, ids: list[int], k: int = 5):
    """Per-token logprob, entropy and top-k from ONE un-cached forward pass over prompt+completion."""
    p = tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([p + ids])).logits[0].float()  # [T, V]
    logp = torch.log_softmax(logits[len(p) - 1 : len(p) + len(ids) - 1], -1)  # position t predicts t+1
    ent = -(logp.exp() * logp).sum(-1)
    lp = logp.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
    tkl, tki = logp.topk(k, -1)
    return lp.numpy(), ent.numpy(), tki.numpy(), tkl.numpy()


def assert_stats_match(model, tokenizer, gens):
    for g in gens:
        lp, ent, tki, tkl = direct_stats(model, tokenizer, g.prompt, g.token_ids.tolist(), g.topk_ids.shape[1])
        np.testing.assert_allclose(g.logprobs, lp, atol=2e-4)
        np.testing.assert_allclose(g.entropies, ent, atol=2e-4)
        np.testing.assert_allclose(g.topk_logprobs, tkl, atol=2e-4)
        # ids can only differ where two alternatives tie
        assert (g.topk_ids == tki).mean() > 0.99


def test_sampled_statistics_equal_direct_softmax(sample_policy):
    gens = sample_policy.sample(PROMPTS, n=4, temperature=1.0, max_new_tokens=40, seed=11)
    assert len(gens) == 12 and [g.prompt_index for g in gens[:5]] == [0, 0, 0, 0, 1]
    assert_stats_match(sample_policy.model, sample_policy.tokenizer, gens)
    for g in gens:
        assert g.n_tokens == len(g.token_texts) == len(g.entropies) and g.topk_ids.shape == (g.n_tokens, 5)
        assert (g.entropies >= 0).all() and (g.entropies <= np.log(len(sample_policy.tokenizer)) + 1e-4).all()
        # the text is the decoded tokens, minus the end token
        assert "".join(t for t in g.token_texts if t != "<eos>") == g.text


def test_finish_reason(sample_policy):
    stopped = sample_policy.sample(["Q: 2+3="], n=4, max_new_tokens=40, seed=0)
    assert any(g.finish_reason == "stop" for g in stopped)  # the policy learned to end its answers
    for g in stopped:
        if g.finish_reason == "stop":
            assert g.token_ids[-1] == sample_policy.tokenizer.eos_token_id
    cut = sample_policy.sample(["Q: 23+48-7="], n=2, max_new_tokens=3, seed=0)
    assert all(g.finish_reason == "length" and g.n_tokens == 3 for g in cut)


def test_seed_makes_sampling_reproducible(sample_policy):
    a = sample_policy.sample(PROMPTS, n=3, seed=5)
    b = sample_policy.sample(PROMPTS, n=3, seed=5)
    c = sample_policy.sample(PROMPTS, n=3, seed=6)
    assert [g.text for g in a] == [g.text for g in b]
    assert [g.text for g in a] != [g.text for g in c]


def test_greedy_and_tiny_top_p_pick_the_argmax(sample_policy):
    greedy = sample_policy.sample(PROMPTS, n=1, temperature=0, seed=0)
    nucleus = sample_policy.sample(PROMPTS, n=1, temperature=1.0, top_p=1e-6, seed=123)
    for g, h in zip(greedy, nucleus, strict=False):
        assert (g.token_ids == g.topk_ids[:, 0]).all()
        assert g.text == h.text


def test_teacher_forced_scorer_reproduces_sampling_stats(sample_policy):
    gens = sample_policy.sample(PROMPTS, n=2, seed=3)
    scored = sample_policy.score([g.prompt for g in gens], [g.token_ids.tolist() for g in gens])
    for g, s in zip(gens, scored, strict=False):
        assert (s.token_ids == g.token_ids).all() and s.finish_reason == g.finish_reason
        np.testing.assert_allclose(s.logprobs, g.logprobs, atol=2e-4)
        np.testing.assert_allclose(s.entropies, g.entropies, atol=2e-4)
    # text completions are tokenized without special tokens
    by_text = sample_policy.score(["Q: 2+3="], ["2+3=5;A:5"])[0]
    assert by_text.text == "2+3=5;A:5" and by_text.n_tokens == 9


def test_load_policy_is_cached_per_process():
    assert load_policy(POLICY_DIR, device="cpu") is load_policy(str(POLICY_DIR), device="cpu")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_backend_is_architecture_agnostic(arch, tmp_path):
    """A randomly initialised tiny Llama / Qwen2 saved with save_pretrained works the same way."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(POLICY_DIR)
    cfg_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    torch.manual_seed(0)
    cfg = cfg_cls(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    model_cls(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    policy = Policy(tmp_path, device="cpu")
    assert policy.model.config.model_type == arch
    gens = policy.sample(PROMPTS, n=2, max_new_tokens=12, seed=0)
    assert_stats_match(policy.model, policy.tokenizer, gens)
    scored = policy.score([g.prompt for g in gens], [g.token_ids.tolist() for g in gens])
    np.testing.assert_allclose(scored[0].entropies, gens[0].entropies, atol=2e-4)


def test_bad_policy_folders_get_clear_errors(tmp_path):
    with pytest.raises(PolicyLoadError, match="does not exist"):
        Policy(tmp_path / "nope")
    (tmp_path / "file.bin").write_bytes(b"x")
    with pytest.raises(PolicyLoadError, match="is a file"):
        Policy(tmp_path / "file.bin")
    with pytest.raises(PolicyLoadError, match="no config.json"):
        Policy(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(POLICY_DIR, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(PolicyLoadError, match="could not load"):
        Policy(broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(PolicyLoadError, match="no weights"):
        Policy(broken)


def test_sample_batch_rejects_empty_prompt(sample_policy):
    with pytest.raises(ValueError, match="at least one token"):
        sample_batch(sample_policy.model, sample_policy.tokenizer, [""])


def test_score_batch_checks_lengths(sample_policy):
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        score_batch(sample_policy.model, sample_policy.tokenizer, ["a", "b"], ["x"])


def test_token_texts_of_a_byte_level_bpe_concatenate_to_the_text():
    """Spaces and multi-byte characters come out as a person reads them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from backends.policy import token_texts

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["héllo wörld naïve café"] * 20,
                            trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe = PreTrainedTokenizerFast(tokenizer_object=tok)
    ids = bpe("héllo wörld ✓ naïve")["input_ids"]  # '✓' was never seen: it splits into byte tokens
    pieces = token_texts(bpe, [ids])[0]
    assert len(pieces) == len(ids)
    assert pieces[:2] == ["héllo", " wörld"]
    assert "".join(pieces).replace("\ufffd", "").startswith("héllo wörld ")
