"""Lint and types are part of the test command: `ruff check` over the tree, and mypy --strict over the
modules that have been brought under it (new code is strict from its first commit; the list grows as
modules are redesigned, never shrinks).

mypy resolves `specctl.*` by module name, but the repository root *is* the package (pyproject's
package-dir), so the check runs from a temporary folder holding a `specctl` link to the root.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Files (relative to the root) checked with `mypy --strict`.
STRICT = (
    "schemas/platforms/__init__.py",
    "schemas/platforms/yamltext.py",
    "schemas/platforms/plan.py",
    "schemas/platforms/kubernetes.py",
    "schemas/platforms/rbg.py",
    "schemas/platforms/lws.py",
    "schemas/platforms/dynamo.py",
    "schemas/platforms/slurm.py",
    "schemas/platforms/manifest.py",
    "errors.py",
    "schemas/__init__.py",
    "schemas/catalog.py",
    "schemas/findings.py",
    "schemas/model_facts.py",
    "schemas/report.py",
    "schemas/rules.py",
    "schemas/rules_pd.py",
    "bench/__init__.py",
    "bench/acceptance.py",
    "bench/arrivals.py",
    "bench/code_prompts.py",
    "bench/compare.py",
    "bench/config.py",
    "bench/load.py",
    "bench/pacer.py",
    "bench/progress.py",
    "bench/prometheus.py",
    "bench/record.py",
    "bench/report.py",
    "schemas/server_info.py",
    "bench/stub_server.py",
    "bench/target.py",
    "engine/alloc.py",
    "engine/smallgemm.py",
    "adaptive/policy.py",
    "engine/speculative/verify.py",
    "engine/speculative/decoder.py",
    "engine/serve/metrics.py",
    "cli/__init__.py",
    "cli/__main__.py",
    "cli/adaptive.py",
    "cli/bench.py",
    "cli/common.py",
    "cli/generate.py",
    "cli/main.py",
    "cli/options.py",
    "cli/serve.py",
    "cli/validate.py",
    "cli/preflight.py",
    "preflight/__init__.py",
    "preflight/facts.py",
    "preflight/diff.py",
    "preflight/reader.py",
    "preflight/check.py",
    "schemas/sglang/__init__.py",
    "schemas/sglang/command.py",
    "schemas/sglang/flags.py",
    "schemas/sglang/release.py",
    "schemas/sglang/families.py",
    "schemas/sglang/drafts.py",
    "schemas/sglang/mapping.py",
    "schemas/sglang/rules.py",
    "schemas/sglang/export.py",
    "schemas/sglang/importer.py",
    "schemas/sglang/sniff.py",
    "schemas/sglang/startup.py",
    "schemas/sglang/resolver.py",
    "schemas/sglang/resolve_child.py",
    "schemas/sglang/verdicts.py",
    "cli/model.py",
    "cli/sglang_io.py",
    "engine/serve/openai_request.py",
    "engine/serve/http.py",
    "engine/logprobs.py",
    "engine/penalties.py",
    "bench/request.py",
    "bench/metrics.py",
    "adaptive/trace.py",
    "adaptive/sglang_trace.py",
    "engine/serve/spec_stats.py",
    "preflight/watch.py",
    "cli/watch.py",
    "adaptive/tune.py",
    "engine/speculative/drafter.py",
    "engine/cache.py",
    "engine/model_runner.py",
    "engine/speculative/profile.py",
    "engine/serve/sglang_http.py",
    "orchestrate/router.py",
    "engine/install.py",
    "orchestrate/ports.py",
    "engine/pd/messages.py",
    "engine/pd/bootstrap.py",
    "engine/serve/prefill.py",
    "engine/serve/decode.py",
    "engine/pd/__init__.py",
    "engine/serve/__init__.py",
    "engine/speculative/__init__.py",
    "orchestrate/sglang_process.py",
    "orchestrate/launcher.py",
    "engine/serve/backend.py",
    "engine/serve/faults.py",
    "engine/serve/roles.py",
    "engine/detokenizer.py",
    "engine/tokenizer.py",
    "bench/probe.py",
    "bench/ab.py",
    "engine/sampling.py",
    "engine/sequence.py",
    "engine/scheduler.py",
    "engine/device.py",
    "engine/config.py",
    "engine/checkpoint.py",
    "engine/engine.py",
    "engine/async_engine.py",
    "schemas/adaptive.py",
    "schemas/adaptive_config.py",
    "schemas/adaptive_coverage.py",
    "schemas/adaptive_parser.py",
    "schemas/adaptive_rules.py",
    "schemas/deployment.py",
    "schemas/overrides.py",
    "presets/__init__.py",
    "bench/workload.py",
    "bench/runner.py",
    "bench/plot.py",
    "schemas/fastschema.py",
    "schemas/loader.py",
    "schemas/validator.py",
    "schemas/rules_capacity.py",
    "schemas/rules_fallback.py",
    "schemas/rules_model.py",
    "schemas/rules_topology.py",
    "engine/__init__.py",
    "engine/pd/registration.py",
    "engine/pd/transfer.py",
    "engine/pd/wire.py",
    "engine/pd/outbox.py",
    "engine/pd/rooms.py",
    "engine/prefill_export.py",
    "schemas/budget.py",
    "schemas/sglang/router.py",
    "engine/model.py",
)


def _module(path: str) -> str:
    name = "specctl." + path.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def test_ruff_check_is_clean() -> None:
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.slow
def test_strict_modules_type_check(tmp_path: Path) -> None:
    missing = [p for p in STRICT if not (ROOT / p).is_file()]
    assert not missing, f"listed for mypy but gone: {missing}"
    (tmp_path / "specctl").symlink_to(ROOT, target_is_directory=True)
    args = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
            "--cache-dir", str(tmp_path / ".mypy_cache"), "--no-error-summary"]
    for path in STRICT:
        args += ["-m", _module(path)]
    env = {**os.environ, "MYPYPATH": str(tmp_path)}
    res = subprocess.run(args, capture_output=True, text=True, timeout=280, cwd=tmp_path, env=env, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
