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
"""

from __future__ import annotations

import argparse
import json
import math
import os
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
from specctl.schemas.model_facts import builtin_dir, load_model_facts

HELD_OUT_MOD = 20


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
    model = load_model(f"builtin:{name}")
    logits = model(x[:, :-1])
    out: dict = {"model": name, "held_out_windows": windows, "seq": seq}
    out["val_loss"] = round(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item(), 4)
    out["next_byte_accuracy"] = round((logits.argmax(-1) == x[:, 1:]).float().mean().item(), 4)
    if against:
        other = load_model(f"builtin:{against}")(x[:, :-1])
        out["against"] = against
        out["against_val_loss"] = round(
            F.cross_entropy(other.reshape(-1, other.shape[-1]), x[:, 1:].reshape(-1)).item(), 4
        )
        out["greedy_agreement"] = round((other.argmax(-1) == logits.argmax(-1)).float().mean().item(), 4)
    runner = ModelRunner(f"builtin:{name}", max_tokens=4096, max_requests=1)
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
    ap.add_argument("--windows", type=int, default=64, help="with --evaluate: held-out windows of --seq bytes")
    ap.add_argument("--prompt", default="def fibonacci(n):")
    ap.add_argument("--max-new", type=int, default=200)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    if args.evaluate:
        print(json.dumps(report(args.model, args.against, args.seq, args.windows, args.prompt, args.max_new), indent=1))
        return 0
    torch.manual_seed(args.seed)
    out_dir = args.out_dir or builtin_dir(args.model)
    cfg = ModelConfig.from_facts(load_model_facts(f"builtin:{args.model}"))
    model = HybridForCausalLM(cfg)
    model.init_weights(seed=args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    train, held, stats = load_corpus()
    print(f"{args.model}: {n_params} params, corpus {stats}", flush=True)

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
        "steps_done": 0,
        "history": [],
        "evals": [],
    }
    g = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    last_save = t0
    ema = None
    step = 0
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x = batch(train, args.batch, args.seq, g)
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        elapsed = time.time() - t0
        log["steps_done"] = step + 1
        if step % 25 == 0 or step == args.steps - 1:
            log["history"].append({"step": step, "loss": round(lv, 4), "ema": round(ema, 4), "t": round(elapsed, 1)})
            print(f"step {step} loss {lv:.4f} ema {ema:.4f} lr {lr_at(step):.2e} t {elapsed:.0f}s", flush=True)
        if (step + 1) % args.eval_every == 0:
            vl = evaluate(model, held, args.batch, args.seq, args.eval_batches)
            log["evals"].append({"step": step + 1, "val_loss": round(vl, 4), "t": round(elapsed, 1)})
            print(f"eval step {step + 1} val_loss {vl:.4f}", flush=True)
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
    print(f"done: {log['steps_done']} steps, {log['train_seconds']}s, val_loss {log['final_val_loss']}", flush=True)
    save(model, out_dir, log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
