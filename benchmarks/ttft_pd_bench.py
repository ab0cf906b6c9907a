"""TTFT of a disaggregated deployment vs the same engine colocated (low load), and prefill queueing under a
burst with batched prefill vs one-at-a-time prefill, side by side in one run.

    python benchmarks/ttft_pd_bench.py [-c tiny-pd] [--prompt-tokens 1000] [--requests 10]
        [--burst 16 --burst-tokens 200 --burst-rounds 3] [--set roles.router.port=...]

Launches the deployment's prefill/decode/router topology AND a colocated process with the same model,
cache and speculative settings (a temporary deployment file), then sends one streaming request at a
time, alternating between the two (so machine noise hits both alike), each with a different
`--prompt-tokens`-byte slice of CPython's standard-library source (byte tokenizer: one token per byte).
TTFT = client send -> first streamed token. Reports medians and the PD/colocated ratio (issue target
<= 1.25), plus the server-side split of PD TTFT (prefill compute, transfer, decode queueing). Prints a
table, then one JSON line.

Burst part: `--burst` concurrent `--burst-tokens`-token prompts through the router, `--burst-rounds` times,
on the deployment with `roles.prefill.serve.max_batch_size=--prefill-batch` (prefill admits every room into
its Engine: batched, chunked; a prefill holds a room only until its KV is sent, so its batch is sized for
bursts, not for decoding) and on the baseline, the same topology with `roles.prefill.serve.max_batch_size=1`
(prefill runs one request per forward, what the old one-at-a-time prefill path did). Both topologies run at
once on free ports and the rounds interleave (order alternating), so noise hits both alike. Mean prefill
queue = arrival of the room on prefill -> the engine step that prefills it (decode reports it as
`prefill_queue_s`), one mean per round; reported: the median over rounds; target: baseline / batched >= 3.
The engine's prefill step budget (`EngineConfig.max_prefill_tokens`, 2048 tokens) bounds one step: a burst
of 16 x 200 tokens needs two prefill steps batched, so its second half queues behind the first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from specctl.orchestrate.launcher import Launcher
from specctl.schemas.validator import load_deployment


def corpus_slices(n: int, size: int) -> list[str]:
    import inspect
    import json as json_mod

    text = "".join(inspect.getsource(m) for m in (json_mod.decoder, json_mod.encoder, inspect, argparse))
    data = text.encode("ascii", errors="ignore").decode()
    step = max(1, (len(data) - size) // max(1, n))
    return [data[i * step : i * step + size] for i in range(n)]


def burst(url: str, prompts: list[str]) -> list[dict[str, Any]]:
    import threading

    out: list[dict[str, Any]] = [{} for _ in prompts]

    def one(i: int) -> None:
        out[i] = stream_ttft(url, prompts[i])[1]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return out


def run_bursts(variants: dict[str, tuple[Any, list[str]]], log_dir: Path, prompts: list[str], rounds: int,
               env: dict[str, str]) -> dict[str, list[float]]:
    """Per variant, the mean prefill queue (s) of each of `rounds` bursts: every variant's topology runs at
    once (on its own free ports) and the rounds interleave, the order alternating each round, so machine
    noise (other processes, thermal) hits every variant alike."""
    from specctl.bench.ab import port_overrides

    launchers: dict[str, Launcher] = {}
    try:
        for name, (dep, overrides) in variants.items():
            moved = [*overrides, *port_overrides(dep.raw)]
            launchers[name] = Launcher(load_deployment(dep.path, overrides=moved), overrides=moved,
                                       log_dir=log_dir / name, env=env)
            launchers[name].start()
        for la in launchers.values():
            la.wait_ready(600)
        for la in launchers.values():
            stream_ttft(la.url, prompts[0])  # warm-up: first forwards
            burst(la.url, prompts)  # warm-up: the router opens its connections to the workers (one per concurrent)
        means: dict[str, list[float]] = {name: [] for name in launchers}
        names = list(launchers)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                queues = [float(t.get("prefill_queue_s", 0.0)) for t in burst(launchers[name].url, prompts)]
                means[name].append(statistics.mean(queues))
        return means
    finally:
        for la in launchers.values():
            la.stop()


_MODELS: dict[str, str] = {}


def served_model(url: str) -> str:
    """The model the server at `url` serves (its /v1/models): requests must name it (an unknown name is a 404)."""
    if url not in _MODELS:
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:  # noqa: S310 - loopback
            _MODELS[url] = str(json.loads(r.read())["data"][0]["id"])
    return _MODELS[url]


def stream_ttft(url: str, prompt: str) -> tuple[float, dict[str, Any]]:
    body = json.dumps({"model": served_model(url), "prompt": prompt, "max_tokens": 2, "temperature": 0, "stream": True,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft = None
    timings: dict[str, Any] = {}
    with urllib.request.urlopen(req, timeout=120) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            if ttft is None and event["choices"] and event["choices"][0].get("text") is not None:
                ttft = time.perf_counter() - t0
            timings = event.get("timings") or timings
    assert ttft is not None
    return ttft, timings


def colocated_file(dep: Any, port: int, directory: Path) -> Path:
    raw = dict(dep.raw)
    raw["name"] = f"{dep.name}-colocated"
    raw["roles"] = {"colocated": {"host": "127.0.0.1", "port": port}}
    path = directory / "colocated.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default="tiny-pd")
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--colocated-port", type=int, default=30100)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="OMP_NUM_THREADS of every engine process, PD and colocated alike (at low load decode "
                    "idles while prefill computes, so each prefill gets what the colocated engine gets)")
    ap.add_argument("--burst", type=int, default=16, help="concurrent requests of the burst part (0: skip it)")
    ap.add_argument("--burst-tokens", type=int, default=200)
    ap.add_argument("--burst-rounds", type=int, default=5)
    ap.add_argument("--prefill-batch", type=int, default=16, help="prefill's serve.max_batch_size, batched run")
    ap.add_argument("--set", action="append", default=["transfer.timeout_s=300"],
                    help="deployment override a.b.c=value (repeatable); a long transfer timeout by default so "
                    "a slow first forward on a busy machine does not fail the warm-up")
    args = ap.parse_args()

    pd = load_deployment(args.config, overrides=args.set)
    tmp = Path(tempfile.mkdtemp(prefix="specctl-ttft-"))
    colo = load_deployment(colocated_file(pd, args.colocated_port, tmp))
    env = {"OMP_NUM_THREADS": str(args.threads)}
    launchers = [Launcher(pd, overrides=args.set, log_dir=tmp / "pd", env=env),
                 Launcher(colo, log_dir=tmp / "colocated", env=env)]
    try:
        for la in launchers:
            la.start()
        for la in launchers:
            la.wait_ready(600)
        prompts = corpus_slices(args.requests + 1, args.prompt_tokens)
        for la in launchers:  # warm-up (first forward allocates buffers)
            stream_ttft(la.url, prompts[-1])
        pd_ttft, colo_ttft, splits, colo_server = [], [], [], []
        for p in prompts[: args.requests]:
            t, timings = stream_ttft(launchers[0].url, p)
            pd_ttft.append(t)
            splits.append(timings)
            t_colo, colo_timings = stream_ttft(launchers[1].url, p)
            colo_ttft.append(t_colo)
            colo_server.append(float(colo_timings.get("ttft_s", 0.0)))
    finally:
        for la in launchers:
            la.stop()
    queue: dict[str, Any] = {}
    if args.burst:
        bprompts = corpus_slices(args.burst, args.burst_tokens)
        sized = [*args.set, f"roles.prefill.serve.max_batch_size={args.prefill_batch}"]
        single = [*args.set, "roles.prefill.serve.max_batch_size=1"]
        means = run_bursts({"batched": (load_deployment(args.config, overrides=sized), sized),
                            "one_at_a_time": (load_deployment(args.config, overrides=single), single)},
                           tmp / "burst", bprompts, args.burst_rounds, env)
        mb, mo = statistics.median(means["batched"]), statistics.median(means["one_at_a_time"])
        per_round = [o / b for o, b in zip(means["one_at_a_time"], means["batched"], strict=True) if b > 0]
        queue = {"burst": args.burst, "burst_tokens": args.burst_tokens, "rounds": args.burst_rounds,
                 "prefill_batch": args.prefill_batch, "interleaved": True,
                 "round_mean_prefill_queue_s": means,
                 "mean_prefill_queue_batched_s": mb, "mean_prefill_queue_one_at_a_time_s": mo,
                 "queue_ratio_one_at_a_time_over_batched": mo / mb if mb > 0 else float("inf"),
                 "queue_ratio_per_round_median": statistics.median(per_round) if per_round else None,
                 "target_ratio": 3.0}

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    split = {k: med([s.get(k, 0.0) for s in splits]) for k in ("prefill_s", "prefill_queue_s", "prefill_wait_s",
                                                               "transfer_s", "decode_queue_s")}
    ratio = med(pd_ttft) / med(colo_ttft)
    print(f"{'':<28}{'median':>10}{'p90':>10}")
    for name, xs in (("TTFT colocated (s)", colo_ttft), ("TTFT disaggregated (s)", pd_ttft)):
        xs_sorted = sorted(xs)
        print(f"{name:<28}{med(xs):>10.4f}{xs_sorted[int(0.9 * (len(xs) - 1))]:>10.4f}")
    print(f"  colocated server-side ttft_s{med(colo_server):>10.4f}")
    for k, v in split.items():
        print(f"  PD {k:<24}{v:>10.4f}")
    print(f"TTFT ratio disaggregated/colocated: {ratio:.3f} (target <= 1.25)")
    ok = ratio <= 1.25
    if queue:
        print(f"burst of {args.burst} x {args.burst_tokens} tokens, {args.burst_rounds} interleaved rounds: median of "
              f"the rounds' mean prefill queue: batched {queue['mean_prefill_queue_batched_s']:.4f}s, one-at-a-time "
              f"{queue['mean_prefill_queue_one_at_a_time_s']:.4f}s, ratio "
              f"{queue['queue_ratio_one_at_a_time_over_batched']:.2f} (per-round median "
              f"{queue['queue_ratio_per_round_median']:.2f}; target >= 3)")
        ok = ok and queue["queue_ratio_one_at_a_time_over_batched"] >= 3.0
    print(json.dumps({"benchmark": "ttft_pd", "deployment": pd.name, "prompt_tokens": args.prompt_tokens,
                      "requests": args.requests, "ttft_colocated_median_s": med(colo_ttft),
                      "ttft_pd_median_s": med(pd_ttft), "ratio_pd_over_colocated": ratio,
                      "pd_split_median_s": split, "target_ratio": 1.25, "burst_queue": queue, "ok": ok}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
