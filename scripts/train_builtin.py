"""Train a builtin model (`engine/builtin_models/NAME/`) on the CPython standard library source.

Reproduces the shipped weights: byte-level ids (0-255 bytes, 256 bos, 257 eos), corpus = every `*.py` file
of this interpreter's stdlib outside `site-packages` and test directories, split deterministically by a
CRC32 of the relative path (1 in 20 files held out), seeded sampling of random windows, AdamW with
warm-up and cosine decay over a fixed number of steps. Writes `model.safetensors` (float32; the tied
`lm_head` is not stored) and `train_log.json` into the model directory every `--save-every` seconds and at
the end, so partial weights exist early. `--max-seconds` stops early (keeping the schedule's step count
in the log) when a wall budget runs out.

    python scripts/train_builtin.py --model tiny-draft --steps 1500 --batch 16 --seq 256
    python scripts/train_builtin.py --model tiny-hybrid --steps 3000 --batch 16 --seq 256 --max-seconds 4000
    python scripts/train_builtin.py --model tiny-hybrid --evaluate --against tiny-draft   # model-card figures

Distillation (`--distill-from TEACHER`): the loss becomes `A * KL(p_teacher || p_model) + (1 - A) * CE`
(`--distill-alpha A`, forward KL over the whole vocabulary, per position, in nats), the teacher running in
eval mode without gradients on the same random windows; `--init-from MODEL` starts from trained weights
(fine-tuning) instead of a fresh init. It trains the draft to agree with the target rather than with the
corpus, which is what speculative acceptance measures (DistillSpec, Zhou et al. 2023). The held-out
evaluations then also log the KL and greedy agreement with the teacher. A `--out-dir` outside the
model directory gets the model's config.json and tokenizer files too, so it is a loadable model dir
(`--evaluate --against-dir DIR`, `spec_bench.py --draft DIR`):

    python scripts/train_builtin.py --model tiny-draft --distill-from tiny-hybrid --init-from tiny-draft \
        --distill-alpha 1.0 --lr 1e-3 --warmup 50 --steps 4000 --max-seconds 1200 --out-dir /tmp/distill-draft
    python scripts/train_builtin.py --model tiny-hybrid --evaluate --against-dir /tmp/distill-draft

`--teacher-windows N` (with `--distill-from`) first has the teacher write N windows of its own: train-split
prompts continued through specctl's engine, half greedy, half sampled at temperature 1; `--teacher-mix F`
of every batch is then drawn from them. A draft distilled on the corpus alone learns the target's next
byte on human text, while speculation asks it on the target's own continuations (the MODEL_CARD's
figures: the shipped draft's second and third stages).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import sysconfig
import time
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from specctl.engine.model import HybridForCausalLM, ModelConfig
from specctl.engine.tokenizer import BYTE_BOS, BYTE_EOS
from specctl.schemas.model_facts import load_model_facts, resolve_model_dir

HELD_OUT_MOD = 20
# Files of a model directory other than the weights and the log: copied into an --out-dir elsewhere.
MODEL_DIR_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer")


def model_ref(name: str) -> str:
    """A builtin name (`tiny-draft`) as `builtin:tiny-draft`; a `builtin:` ref or a directory path as is."""
    if name.startswith("builtin:") or os.sep in name or Path(name).is_dir():
        return name
    return f"builtin:{name}"


def corpus_files(root: Path) -> list[Path]:
    """Sorted stdlib sources, excluding site-packages and test suites (deterministic for one CPython)."""
    out = []
    for p in sorted(root.rglob("*.py")):
        parts = p.relative_to(root).parts
        if parts[0] == "site-packages" or any(x in ("test", "tests", "idle_test") for x in parts[:-1]):
            continue
        out.append(p)
    return out


def is_held_out(rel: str) -> bool:
    return zlib.crc32(rel.encode()) % HELD_OUT_MOD == 0


def load_corpus(root: Path | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(train ids, held-out ids, stats). Each file becomes bos + bytes + eos."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    train: list[bytes] = []
    held: list[bytes] = []
    for p in corpus_files(root):
        rel = p.relative_to(root).as_posix()
        data = p.read_bytes()
        if not data:
            continue
        (held if is_held_out(rel) else train).append(data)

    def pack(docs: list[bytes]) -> torch.Tensor:
        chunks = []
        for d in docs:
            t = torch.empty(len(d) + 2, dtype=torch.int16)
            t[0] = BYTE_BOS
            t[1:-1] = torch.frombuffer(bytearray(d), dtype=torch.uint8).to(torch.int16)
            t[-1] = BYTE_EOS
            chunks.append(t)
        return torch.cat(chunks)

    stats = {
        "root": str(root),
        "python": sys.version.split()[0],
        "train_files": len(train),
        "held_out_files": len(held),
        "train_bytes": sum(map(len, train)),
        "held_out_bytes": sum(map(len, held)),
    }
    return pack(train), pack(held), stats


def batch(data: torch.Tensor, bsz: int, seq: int, g: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(data) - seq - 1, (bsz,), generator=g)
    idx = starts[:, None] + torch.arange(seq + 1)
    return data[idx].long()


@torch.no_grad()
def evaluate(model: HybridForCausalLM, data: torch.Tensor, bsz: int, seq: int, n_batches: int) -> float:
    g = torch.Generator().manual_seed(1234)  # the same held-out windows at every evaluation
    model.eval()
    total = 0.0
    for _ in range(n_batches):
        x = batch(data, bsz, seq, g)
        logits = model(x[:, :-1])
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item()
    model.train()
    return total / n_batches


def distill_kl(logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Forward KL(p_teacher || p_model) per position, averaged over positions (nats); [..., vocab] each."""
    v = logits.shape[-1]
    return F.kl_div(
        F.log_softmax(logits.reshape(-1, v).float(), -1),
        F.log_softmax(teacher_logits.reshape(-1, v).float(), -1),
        log_target=True,
        reduction="batchmean",
    )


def teacher_windows(
    teacher_ref: str, data: torch.Tensor, n: int, seq: int, seed: int, threads: int
) -> tuple[torch.Tensor, dict]:
    """`n` windows of `seq + 1` ids, each a prompt cut from `data` (32 to 160 ids at --seq 256; at most 5/8 of a
    window) continued by the teacher through specctl's own engine: half greedy, half sampled at temperature 1
    (seeded). Speculative acceptance is agreement on the contexts the target itself produces (its own
    continuations of a prompt), which the corpus holds only in part: a greedy target repeats names,
    indentation and whole lines its own way (DistillSpec, Zhou et al. 2023, trains on teacher- or
    student-generated text for this). Returns ([n, seq + 1] int16, stats)."""
    from specctl.engine.config import EngineConfig
    from specctl.engine.engine import Engine
    from specctl.engine.sampling_params import SamplingParams

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed + 7)
    eng = Engine(EngineConfig(model_ref=teacher_ref, dtype="float32", device="cpu", page_size=16,
                              max_tokens=65536, max_batch_size=64))
    prompts: list[list[int]] = []
    params: list[SamplingParams] = []
    hi = max(1, min(160, 5 * seq // 8))  # prompt lengths lo..hi; at --seq 256, 32..160
    lo = min(32, hi // 2) or 1
    for i in range(n):
        plen = int(torch.randint(lo, hi + 1, (1,), generator=g))
        start = int(torch.randint(0, len(data) - plen - 1, (1,), generator=g))
        prompts.append(data[start : start + plen].long().tolist())
        temp = 0.0 if i % 2 == 0 else 1.0
        params.append(SamplingParams(max_tokens=seq + 1 - plen, temperature=temp, seed=seed * 1_000_003 + i,
                                     ignore_eos=True))
    out = torch.empty(n, seq + 1, dtype=torch.int16)
    t0 = time.time()
    for first in range(0, n, 64):
        for j, r in enumerate(eng.generate(prompts[first : first + 64], params[first : first + 64])):
            ids = prompts[first + j] + r.token_ids
            out[first + j] = torch.tensor(ids[: seq + 1], dtype=torch.int16)
        print(f"teacher windows: {min(first + 64, n)}/{n} in {time.time() - t0:.0f}s", flush=True)
    stats = {"windows": n, "seq": seq, "prompt_ids": [lo, hi], "greedy_fraction": 0.5, "sampled_temperature": 1.0,
             "seconds": round(time.time() - t0, 1)}
    return out, stats


def train_step(
    model: HybridForCausalLM,
    x: torch.Tensor,
    opt: torch.optim.Optimizer,
    teacher: HybridForCausalLM | None = None,
    alpha: float = 1.0,
) -> dict[str, float]:
    """One optimiser step on windows `x` [b, seq + 1]: CE on the next byte, or with a teacher
    `alpha * KL(teacher || model) + (1 - alpha) * CE`. Returns the loss and its parts."""
    inp, tgt = x[:, :-1], x[:, 1:]
    logits = model(inp)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
    out: dict[str, float] = {}
    if teacher is None:
        loss = ce
    else:
        with torch.no_grad():
            t_logits = teacher(inp)
        kl = distill_kl(logits, t_logits)
        loss = alpha * kl + (1 - alpha) * ce
        out["kl"] = kl.item()
        out["agreement"] = (logits.detach().argmax(-1) == t_logits.argmax(-1)).float().mean().item()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    out["loss"] = loss.item()
    out["ce"] = ce.item()
    return out


@torch.no_grad()
def evaluate_distill(
    model: HybridForCausalLM, teacher: HybridForCausalLM, data: torch.Tensor, bsz: int, seq: int, n_batches: int
) -> tuple[float, float]:
    """(mean KL(teacher || model), greedy next-byte agreement) on the same held-out windows as `evaluate`."""
    g = torch.Generator().manual_seed(1234)
    model.eval()
    kl = agree = 0.0
    for _ in range(n_batches):
        x = batch(data, bsz, seq, g)[:, :-1]
        logits, t_logits = model(x), teacher(x)
        kl += distill_kl(logits, t_logits).item()
        agree += (logits.argmax(-1) == t_logits.argmax(-1)).float().mean().item()
    model.train()
    return kl / n_batches, agree / n_batches


def init_from(model: HybridForCausalLM, ref: str) -> None:
    """Load the weights of `ref` into `model` (same shapes; strict, a tied lm_head excepted)."""
    from specctl.engine.checkpoint import load_state_dict

    sd = load_state_dict(resolve_model_dir(ref), ref)
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    model.load_state_dict(sd, strict=True)
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save(model: HybridForCausalLM, out_dir: Path, log: dict) -> None:
    """Atomic writes, so a reader never sees a half-written file while training runs."""
    sd = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    tmp = out_dir / "model.safetensors.tmp"
    save_file(sd, str(tmp), metadata={"format": "pt", "step": str(log["steps_done"])})
    os.chmod(tmp, 0o644)
    os.replace(tmp, out_dir / "model.safetensors")
    tmp = out_dir / "train_log.json.tmp"
    tmp.write_text(json.dumps(log, indent=1) + "\n")
    os.replace(tmp, out_dir / "train_log.json")


@torch.no_grad()
def report(name: str, against: str | None, seq: int, windows: int, prompt: str, max_new: int) -> dict:
    """Held-out loss of the shipped weights, greedy next-byte agreement with `against` (teacher-forced on
    the same held-out windows), and a greedy continuation of `prompt` through the serving path."""
    from specctl.engine.checkpoint import load_model
    from specctl.engine.model_runner import ForwardItem, ModelRunner

    _, held, _ = load_corpus()
    g = torch.Generator().manual_seed(4321)
    x = batch(held, windows, seq, g)
    model = load_model(model_ref(name))
    logits = model(x[:, :-1])
    out: dict = {"model": name, "held_out_windows": windows, "seq": seq}
    out["val_loss"] = round(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item(), 4)
    out["next_byte_accuracy"] = round((logits.argmax(-1) == x[:, 1:]).float().mean().item(), 4)
    if against:
        other = load_model(model_ref(against))(x[:, :-1])
        out["against"] = against
        out["against_val_loss"] = round(
            F.cross_entropy(other.reshape(-1, other.shape[-1]), x[:, 1:].reshape(-1)).item(), 4
        )
        out["greedy_agreement"] = round((other.argmax(-1) == logits.argmax(-1)).float().mean().item(), 4)
    runner = ModelRunner(model_ref(name), max_tokens=4096, max_requests=1)
    ids = runner.tokenizer.encode(prompt)
    runner.allocate(0, len(ids) + max_new)
    nxt = int(runner.forward([ForwardItem(0, ids, 0)])[-1].argmax())
    gen: list[int] = []
    while len(gen) < max_new and nxt != runner.tokenizer.eos_token_id:
        gen.append(nxt)
        nxt = int(runner.forward([ForwardItem(0, [nxt], runner.cached_len(0))])[-1].argmax())
    out["prompt"] = prompt
    out["greedy_continuation"] = runner.tokenizer.decode(gen)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="builtin model name (engine/builtin_models/NAME)")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--save-every", type=float, default=300.0, help="seconds between checkpoint writes")
    ap.add_argument("--stop-after", type=int, default=None,
                    help="stop after this many steps without changing the schedule (reproduces a budgeted run)")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop early when this wall budget is spent")
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("--evaluate", action="store_true", help="do not train: report on the shipped weights")
    ap.add_argument("--against", default=None, help="with --evaluate: measure greedy agreement with this model")
    ap.add_argument("--against-dir", type=Path, default=None,
                    help="with --evaluate: like --against, for a model directory (e.g. a distilled draft's --out-dir)")
    ap.add_argument("--distill-from", default=None, metavar="TEACHER",
                    help="distil from this model (builtin name or directory): loss = A * KL(teacher || model) + "
                         "(1 - A) * CE, teacher in eval mode on the same windows")
    ap.add_argument("--distill-alpha", type=float, default=1.0, metavar="A",
                    help="weight of the KL term with --distill-from (0..1; 1 = pure distillation)")
    ap.add_argument("--init-from", default=None, metavar="MODEL",
                    help="start from this model's weights (builtin name or directory; same config) instead of a "
                         "fresh init: fine-tuning")
    ap.add_argument("--teacher-windows", type=int, default=0, metavar="N",
                    help="with --distill-from: generate N windows with the teacher (its own continuations of "
                         "train-split prompts, half greedy, half sampled) and mix them into every batch")
    ap.add_argument("--teacher-mix", type=float, default=0.5, metavar="F",
                    help="with --teacher-windows: the fraction of each batch's windows taken from them")
    ap.add_argument("--windows", type=int, default=64, help="with --evaluate: held-out windows of --seq bytes")
    ap.add_argument("--prompt", default="def fibonacci(n):")
    ap.add_argument("--max-new", type=int, default=200)
    args = ap.parse_args(argv)

    if not 0.0 <= args.distill_alpha <= 1.0:
        ap.error(f"--distill-alpha must be in [0, 1], got {args.distill_alpha}")
    if args.teacher_windows < 0:
        ap.error(f"--teacher-windows must be >= 0, got {args.teacher_windows}")
    if args.teacher_windows and not args.distill_from:
        ap.error("--teacher-windows needs --distill-from (the teacher generates them)")
    if not 0.0 <= args.teacher_mix <= 1.0:
        ap.error(f"--teacher-mix must be in [0, 1], got {args.teacher_mix}")
    if args.against and args.against_dir:
        ap.error("give --against or --against-dir, not both")
    torch.set_num_threads(args.threads)
    if args.evaluate:
        against = str(args.against_dir) if args.against_dir else args.against
        print(json.dumps(report(args.model, against, args.seq, args.windows, args.prompt, args.max_new), indent=1))
        return 0
    torch.manual_seed(args.seed)
    src_dir = resolve_model_dir(model_ref(args.model))
    out_dir = args.out_dir or src_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    if out_dir.resolve() != src_dir.resolve():
        for name in MODEL_DIR_FILES:  # make the out dir a loadable model directory
            src, dst = src_dir / name, out_dir / name
            if src.is_dir() and not dst.exists():
                shutil.copytree(src, dst)
            elif src.is_file() and not dst.exists():
                shutil.copy2(src, dst)
    cfg = ModelConfig.from_facts(load_model_facts(model_ref(args.model)))
    model = HybridForCausalLM(cfg)
    model.init_weights(seed=args.seed)
    distill: dict | None = None
    if args.init_from:
        init_ref = model_ref(args.init_from)
        init_from(model, init_ref)
        distill = {"init_from": init_ref}
    teacher: HybridForCausalLM | None = None
    if args.distill_from:
        from specctl.engine.checkpoint import load_model, weight_files

        teacher_ref = model_ref(args.distill_from)
        teacher = load_model(teacher_ref)  # eval mode, fused for inference; used under no_grad only
        if teacher.config.vocab_size != cfg.vocab_size:
            ap.error(f"--distill-from {teacher_ref}: vocabulary {teacher.config.vocab_size} != {cfg.vocab_size}")
        distill = {
            **(distill or {}),
            "teacher": teacher_ref,
            "alpha": args.distill_alpha,
            "teacher_params": sum(p.numel() for p in teacher.parameters()),
            "teacher_weights_sha256": {
                f.name: file_sha256(f) for f in weight_files(resolve_model_dir(teacher_ref))
            },
            "loss": "alpha * KL(p_teacher || p_model) + (1 - alpha) * CE",
        }
    if distill and args.init_from:
        init_dir = resolve_model_dir(distill["init_from"])
        distill["init_weights_sha256"] = {f.name: file_sha256(f) for f in sorted(init_dir.glob("*.safetensors"))}
    n_params = sum(p.numel() for p in model.parameters())
    train, held, stats = load_corpus()
    print(f"{args.model}: {n_params} params, corpus {stats}", flush=True)
    gen: torch.Tensor | None = None
    n_gen = 0
    if args.teacher_windows and distill is not None:
        gen, distill["teacher_windows"] = teacher_windows(
            distill["teacher"], train, args.teacher_windows, args.seq, args.seed, args.threads)
        distill["teacher_mix"] = args.teacher_mix
        n_gen = round(args.batch * args.teacher_mix)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        t = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))

    log: dict = {
        "model": args.model,
        "params": n_params,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "corpus": stats,
        "torch": torch.__version__,
        **({"distill": distill} if distill else {}),
        "steps_done": 0,
        "history": [],
        "evals": [],
    }
    g = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    last_save = t0
    ema = None
    step = 0

    def held_out_eval(step_no: int, elapsed: float) -> dict:
        entry = {"step": step_no, "val_loss": round(evaluate(model, held, args.batch, args.seq, args.eval_batches), 4)}
        if teacher is not None:
            kl, agree = evaluate_distill(model, teacher, held, args.batch, args.seq, args.eval_batches)
            entry.update(val_kl=round(kl, 4), val_agreement=round(agree, 4))
        entry["t"] = round(elapsed, 1)
        print("eval " + " ".join(f"{k} {v}" for k, v in entry.items()), flush=True)
        return entry

    if teacher is not None:  # where the fine-tuning starts from, on the same held-out windows
        log["evals"].append(held_out_eval(0, 0.0))
        t0 = time.time()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x = batch(train, args.batch - n_gen, args.seq, g)
        if gen is not None and n_gen:
            x = torch.cat((x, gen[torch.randint(0, len(gen), (n_gen,), generator=g)].long()))
        parts = train_step(model, x, opt, teacher, args.distill_alpha)
        lv = parts["loss"]
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        elapsed = time.time() - t0
        log["steps_done"] = step + 1
        if step % 25 == 0 or step == args.steps - 1:
            extra = {k: round(parts[k], 4) for k in ("ce", "kl", "agreement") if k in parts and teacher is not None}
            log["history"].append({"step": step, "loss": round(lv, 4), "ema": round(ema, 4), **extra,
                                   "t": round(elapsed, 1)})
            more = "".join(f" {k} {v:.4f}" for k, v in extra.items())
            print(f"step {step} loss {lv:.4f} ema {ema:.4f}{more} lr {lr_at(step):.2e} t {elapsed:.0f}s", flush=True)
        if (step + 1) % args.eval_every == 0:
            log["evals"].append(held_out_eval(step + 1, elapsed))
        if time.time() - last_save > args.save_every:
            save(model, out_dir, log)
            last_save = time.time()
        if args.stop_after is not None and step + 1 >= args.stop_after:
            break
        if args.max_seconds is not None and elapsed > args.max_seconds:
            print(f"wall budget {args.max_seconds}s spent after {step + 1} steps", flush=True)
            break
    log["train_seconds"] = round(time.time() - t0, 1)
    log["final_train_loss_ema"] = round(ema or float("nan"), 4)
    log["final_val_loss"] = round(evaluate(model, held, args.batch, args.seq, args.eval_batches), 4)
    if teacher is not None:
        kl, agree = evaluate_distill(model, teacher, held, args.batch, args.seq, args.eval_batches)
        log["final_val_kl"], log["final_val_agreement"] = round(kl, 4), round(agree, 4)
    print(f"done: {log['steps_done']} steps, {log['train_seconds']}s, val_loss {log['final_val_loss']}", flush=True)
    save(model, out_dir, log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
