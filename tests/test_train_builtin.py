"""scripts/train_builtin.py's distillation: the KL is the forward KL of the teacher's softmax,
a few real optimiser steps lower it, alpha 0 is plain cross-entropy, --init-from starts from the given
weights exactly, and a short real run writes a loadable model directory whose log records the distillation."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from specctl.engine.checkpoint import load_model, write_random_model
from specctl.engine.model import HybridForCausalLM, ModelConfig
from specctl.schemas.model_facts import builtin_dir, load_model_facts

from script_support import load_script  # isort: skip

tb = load_script("scripts/train_builtin.py", "train_builtin_under_test")


def tiny_pair(tmp_path: Path) -> tuple[HybridForCausalLM, HybridForCausalLM, Path]:
    """A random 2-layer teacher (loaded as the script loads one) and a random 1-layer student to train."""
    teacher_dir = write_random_model(tmp_path / "teacher", layer_kinds=("swa", "full"), seed=1)
    student_dir = write_random_model(tmp_path / "student", layer_kinds=("full",), seed=2, std=0.05)
    teacher = load_model(str(teacher_dir))
    student = HybridForCausalLM(ModelConfig.from_facts(load_model_facts(str(student_dir))))
    tb.init_from(student, str(student_dir))
    return teacher, student, student_dir


def fixed_batch(b: int = 4, seq: int = 24) -> torch.Tensor:
    return torch.randint(0, 256, (b, seq + 1), generator=torch.Generator().manual_seed(7))


def test_distill_kl_is_forward_kl_of_the_teacher_softmax():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(3, 5, 260, generator=g), torch.randn(3, 5, 260, generator=g) * 3
    pt = t.softmax(-1)
    expected = (pt * (pt.log() - s.log_softmax(-1))).sum(-1).mean()
    assert torch.allclose(tb.distill_kl(s, t), expected, atol=1e-5)
    assert tb.distill_kl(t, t).abs().item() < 1e-5
    # forward, not reverse: KL(p_t || p_s) differs from KL(p_s || p_t) for these logits
    ps = s.softmax(-1)
    reverse = (ps * (ps.log() - t.log_softmax(-1))).sum(-1).mean()
    assert abs(tb.distill_kl(s, t).item() - reverse.item()) > 0.1


def test_a_few_distillation_steps_lower_the_kl_on_a_fixed_batch(tmp_path):
    torch.manual_seed(0)
    teacher, student, _ = tiny_pair(tmp_path)
    x = fixed_batch()
    with torch.no_grad():
        t_logits = teacher(x[:, :-1])
        before = tb.distill_kl(student(x[:, :-1]), t_logits).item()
    opt = torch.optim.AdamW(student.parameters(), lr=1e-2)
    parts = [tb.train_step(student, x, opt, teacher, alpha=1.0) for _ in range(15)]
    with torch.no_grad():
        after = tb.distill_kl(student(x[:, :-1]), t_logits).item()
    assert parts[0]["loss"] == parts[0]["kl"]  # alpha 1: the loss is the KL alone
    assert abs(parts[0]["kl"] - before) < 1e-4  # the step's KL is measured before the update
    assert after < 0.5 * before, (before, after)
    # the teacher is only read: its weights did not move (compared as t_logits was computed, without grad:
    # with grad off the norms run in the small-row kernel, whose sums may round differently from torch's)
    with torch.no_grad():
        assert teacher(x[:, :-1]).sub(t_logits).abs().max().item() == 0.0


def test_alpha_zero_is_the_plain_cross_entropy_step(tmp_path):
    teacher, a, student_dir = tiny_pair(tmp_path)
    b = HybridForCausalLM(a.config)
    tb.init_from(b, str(student_dir))
    x = fixed_batch()
    opt_a = torch.optim.AdamW(a.parameters(), lr=1e-2)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2)
    pa = tb.train_step(a, x, opt_a, teacher, alpha=0.0)
    pb = tb.train_step(b, x, opt_b)
    assert pa["loss"] == pa["ce"] == pb["loss"]
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_init_from_starts_from_the_given_weights(tmp_path):
    _, student, student_dir = tiny_pair(tmp_path)
    x = fixed_batch()[:, :-1]
    with torch.no_grad():
        assert torch.allclose(student(x), load_model(str(student_dir))(x), atol=1e-5)
    assert student.lm_head.weight is student.model.embed_tokens.weight  # still tied after loading


def test_short_distillation_run_writes_a_loadable_draft_dir(tmp_path, capsys):
    out = tmp_path / "draft"
    rc = tb.main(["--model", "tiny-draft", "--distill-from", "tiny-hybrid", "--init-from", "tiny-draft",
                  "--distill-alpha", "0.75", "--steps", "3", "--batch", "2", "--seq", "32", "--warmup", "1",
                  "--lr", "1e-3", "--eval-every", "3", "--eval-batches", "1", "--out-dir", str(out)])
    assert rc == 0
    log = json.loads((out / "train_log.json").read_text())
    assert log["steps_done"] == 3
    d = log["distill"]
    assert d["teacher"] == "builtin:tiny-hybrid" and d["init_from"] == "builtin:tiny-draft" and d["alpha"] == 0.75
    assert set(d["teacher_weights_sha256"]) == {"model.safetensors"}
    assert log["args"]["distill_from"] == "tiny-hybrid"
    assert [e["step"] for e in log["evals"]] == [0, 3] and all("val_kl" in e and "val_agreement" in e
                                                               for e in log["evals"])
    assert {"ce", "kl"} <= set(log["history"][0]) and 0.0 <= log["final_val_agreement"] <= 1.0
    # the same shapes as the shipped draft (its cost per forward is unchanged), but trained weights
    shipped = builtin_dir("tiny-draft")
    assert json.loads((out / "config.json").read_text()) == json.loads((shipped / "config.json").read_text())
    new, old = load_file(str(out / "model.safetensors")), load_file(str(shipped / "model.safetensors"))
    assert {k: v.shape for k, v in new.items()} == {k: v.shape for k, v in old.items()}
    assert any(not torch.equal(new[k], old[k]) for k in old)
    load_model(str(out))  # a model directory the engine (and spec_bench --draft DIR) loads
    capsys.readouterr()
    assert tb.main(["--model", "tiny-hybrid", "--evaluate", "--against-dir", str(out), "--windows", "2",
                    "--seq", "32", "--max-new", "4"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["against"] == str(out) and 0.0 <= rep["greedy_agreement"] <= 1.0


def test_distill_alpha_outside_0_1_is_a_usage_error(capsys):
    try:
        tb.main(["--model", "tiny-draft", "--distill-from", "tiny-hybrid", "--distill-alpha", "1.5"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("no usage error")
    assert "--distill-alpha" in capsys.readouterr().err


def test_teacher_windows_are_the_teachers_own_continuations(tmp_path):
    """Even windows are greedy: past the prompt every id is the teacher's argmax of what precedes it (by the
    model's own full forward, within float noise); odd windows are sampled, seeded, so a rerun repeats them."""
    teacher_dir = write_random_model(tmp_path / "teacher", layer_kinds=("swa", "full"), seed=1)
    data = torch.randint(0, 256, (4000,), generator=torch.Generator().manual_seed(3)).to(torch.int16)
    win, stats = tb.teacher_windows(str(teacher_dir), data, 4, 40, seed=0, threads=1)
    assert win.shape == (4, 41) and win.dtype == torch.int16 and stats["windows"] == 4
    lo, hi = stats["prompt_ids"]
    teacher = load_model(str(teacher_dir))
    corpus = data.tolist()
    off_argmax = 0  # sampled positions whose id is not the teacher's argmax
    for i in range(4):
        ids = win[i].long().tolist()
        plen = next(n for n in range(hi, lo - 1, -1)
                    if any(corpus[s : s + n] == ids[:n] for s in range(len(corpus) - n)))
        assert lo <= plen <= hi
        with torch.no_grad():
            logits = teacher(win[i : i + 1, :-1].long())[0]
        for pos in range(plen - 1, 40):
            chosen, best = logits[pos, ids[pos + 1]].item(), logits[pos].max().item()
            if i % 2 == 0:
                assert chosen >= best - 1e-4, (i, pos)
            else:
                off_argmax += chosen < best - 1e-4
    assert off_argmax > 0  # the odd windows really sampled
    again, _ = tb.teacher_windows(str(teacher_dir), data, 4, 40, seed=0, threads=1)
    assert torch.equal(win, again)


def test_teacher_windows_need_a_teacher_and_a_count(capsys):
    for argv, says in ((["--teacher-windows", "8"], "--distill-from"),
                       (["--teacher-windows", "-1", "--distill-from", "tiny-hybrid"], ">= 0")):
        try:
            tb.main(["--model", "tiny-draft", *argv])
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError("no usage error")
        assert says in capsys.readouterr().err
