"""Hugging Face checkpoints: our Llama/Qwen2 logits equal `transformers`' (float32, 1e-4), prefill and
step-by-step decode, and loading fails clearly on broken directories. Nothing is fetched from a hub."""

from __future__ import annotations

import inspect
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from specctl.engine.model_runner import ForwardItem, ModelRunner  # noqa: E402
from specctl.errors import UsageError  # noqa: E402

VOCAB = 96


def write_tokenizer(model_dir: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for w in "def return if else for in range print x y n fib ( ) : = + - 1 2".split():
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(model_dir / "tokenizer.json"))


def write_hf_model(model_dir: Path, arch: str):
    transformers = pytest.importorskip("transformers")
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.15,  # large enough that logits depend visibly on the context
        bos_token_id=1,
        eos_token_id=2,
    )
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common, rope_theta=500.0, tie_word_embeddings=False, attention_bias=False)
        cls = transformers.LlamaForCausalLM
    elif arch == "llama3-rope":
        # Llama 3's frequency-dependent rope scaling; a short original context so it touches most frequencies
        scaling = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 16}
        cfg = transformers.LlamaConfig(**common, rope_theta=500.0, tie_word_embeddings=False)
        if hasattr(cfg, "rope_parameters"):
            cfg.rope_parameters = dict(scaling, rope_theta=500.0)
        else:
            cfg.rope_scaling = scaling
        cls = transformers.LlamaForCausalLM
    elif arch == "qwen2-full":  # q/k/v biases, tied embeddings, full attention only (a draft-model shape)
        cfg = transformers.Qwen2Config(**common, rope_theta=10000.0, tie_word_embeddings=True, use_sliding_window=False)
        cls = transformers.Qwen2ForCausalLM
    else:
        cfg = transformers.Qwen2Config(**common, rope_theta=10000.0, tie_word_embeddings=True,
                                       use_sliding_window=True, sliding_window=5, max_window_layers=1)
        cls = transformers.Qwen2ForCausalLM
    torch.manual_seed(0)
    model = cls(cfg).eval()
    model.save_pretrained(str(model_dir), safe_serialization=True)
    write_tokenizer(model_dir)
    return model


@pytest.fixture(scope="module", params=["llama", "qwen2", "llama3-rope"])
def hf_pair(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param) / "model"
    model = write_hf_model(d, request.param)
    return request.param, d, model


def test_prefill_and_decode_logits_match_transformers(hf_pair):
    arch, d, ref_model = hf_pair
    runner = ModelRunner(str(d), page_size=4, max_tokens=128, max_requests=2)
    if arch == "qwen2":
        assert runner.facts.layer_kinds == ("full", "swa", "swa")
    if arch == "llama3-rope":
        assert dict(runner.config.rope_scaling or ())["rope_type"] == "llama3"
        plain = runner.model.inv_freq.clone()
        assert not torch.allclose(plain, 1.0 / (500.0 ** (torch.arange(0, 8, 2).float() / 8)))
    ids = torch.randint(3, VOCAB, (14,), generator=torch.Generator().manual_seed(1)).tolist()
    prompt, rest = ids[:9], ids[9:]
    with torch.no_grad():
        ref_full = ref_model(torch.tensor([ids])).logits[0].float()
        # transformers' own step-by-step decode with its KV cache
        # (transformers >= 5.x names the cache argument `cache`, older ones `past_key_values`)
        new_api = "cache" in inspect.signature(ref_model.forward).parameters
        out = ref_model(torch.tensor([prompt]), use_cache=True)
        past, ref_steps = (out.cache if new_api else out.past_key_values), []
        for t in rest:
            kw = {"cache": past} if new_api else {"past_key_values": past}
            out = ref_model(torch.tensor([[t]]), use_cache=True, **kw)
            past = out.cache if new_api else out.past_key_values
            ref_steps.append(out.logits[0, -1].float())
    runner.allocate(1, len(prompt))
    got_prefill = runner.forward([ForwardItem(1, prompt, 0)])
    torch.testing.assert_close(got_prefill, ref_full[: len(prompt)], rtol=1e-4, atol=1e-4)
    got_steps = [runner.forward([ForwardItem(1, [t], len(prompt) + i)])[0] for i, t in enumerate(rest)]
    torch.testing.assert_close(torch.stack(got_steps), torch.stack(ref_steps), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.stack(got_steps), ref_full[len(prompt) :], rtol=1e-4, atol=1e-4)


def test_tokenizer_json_is_used(hf_pair):
    _, d, _ = hf_pair
    runner = ModelRunner(str(d), max_tokens=64, max_requests=1)
    vocab = json.loads((d / "tokenizer.json").read_text())["model"]["vocab"]
    ids = runner.tokenizer.encode("def fib ( n ) :")
    assert ids == [vocab[w] for w in ("def", "fib", "(", "n", ")", ":")]
    assert runner.tokenizer.decode(ids).split() == ["def", "fib", "(", "n", ")", ":"]
    assert runner.tokenizer.eos_token_id == 2


def test_broken_checkpoints_fail_with_clear_errors(hf_pair, tmp_path):
    _, d, _ = hf_pair
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    cfg = json.loads((bad / "config.json").read_text())

    cfg2 = dict(cfg, architectures=["GPT2LMHeadModel"])
    (bad / "config.json").write_text(json.dumps(cfg2))
    with pytest.raises(UsageError, match="unsupported architecture"):
        ModelRunner(str(bad))

    cfg3 = dict(cfg, intermediate_size=64)
    (bad / "config.json").write_text(json.dumps(cfg3))
    with pytest.raises(UsageError, match="shape mismatch"):
        ModelRunner(str(bad))

    cfg4 = dict(cfg, num_hidden_layers=4)
    cfg4.pop("layer_types", None)
    (bad / "config.json").write_text(json.dumps(cfg4))
    with pytest.raises(UsageError, match="missing"):
        ModelRunner(str(bad))

    (bad / "config.json").write_text(json.dumps(cfg))
    (bad / "tokenizer.json").unlink()
    with pytest.raises(UsageError, match="tokenizer.json"):
        ModelRunner(str(bad))

    for f in bad.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(UsageError, match="no \\*.safetensors"):
        ModelRunner(str(bad))

    with pytest.raises(UsageError, match="no config.json"):
        ModelRunner(str(tmp_path / "nowhere"))


def test_sharded_checkpoint_loads_like_a_single_file(hf_pair, tmp_path):
    arch, d, ref_model = hf_pair
    sharded = tmp_path / "sharded"
    ref_model.save_pretrained(str(sharded), safe_serialization=True, max_shard_size="20KB")
    shutil.copy(d / "tokenizer.json", sharded / "tokenizer.json")
    assert len(list(sharded.glob("*.safetensors"))) > 1 and (sharded / "model.safetensors.index.json").is_file()
    a = ModelRunner(str(d), max_tokens=64, max_requests=1)
    b = ModelRunner(str(sharded), max_tokens=64, max_requests=1)
    ids = [5, 9, 11, 3, 7]
    for r in (a, b):
        r.allocate(0, len(ids))
    torch.testing.assert_close(a.forward([ForwardItem(0, ids, 0)]), b.forward([ForwardItem(0, ids, 0)]),
                               rtol=0, atol=0)
