"""Generate `schemas/sglang/dynamo_flags.json`: the flags NVIDIA Dynamo's SGLang worker
(`python -m dynamo.sglang ...`) takes for itself, from Dynamo's own argument groups.

    python scripts/gen_dynamo_flags.py [--version 1.6.1] [--wheels /work/wheels] [--out FILE]

The `ai-dynamo` wheel (`pip download --no-deps ai-dynamo==X`) is unpacked and, in a child process,
the argument groups `dynamo.sglang.args.parse_args` puts before SGLang's parser are run on an
`argparse` parser: `DynamoRuntimeArgGroup`, `DynamoSGLangArgGroup`, the worker router flags
(`add_worker_router_arguments`), and the legacy SGLang spellings `add_sglang_cli_compat` re-adds
(its module imports the installed SGLang; without one they are left out).
Each option is recorded with its spellings and how many values it takes. Dynamo's compiled runtime
(`dynamo._core`, `dynamo.llm`, ...) is not in that wheel: missing `dynamo.*` modules are stand-ins
(the parser-building code only reads parser names from them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "schemas" / "sglang" / "dynamo_flags.json"
VERSION = "1.6.1"


def _arity(action: argparse.Action) -> str:
    """none (a switch), one, optional (nargs '?'), list (nargs '*'/'+'/N)."""
    if action.nargs == 0:
        return "none"
    if action.nargs is None:
        return "one"
    if action.nargs == "?":
        return "optional"
    return "list"


def child_main(folder: str) -> dict[str, Any]:
    sys.path.insert(0, folder)
    sys.path.insert(0, str(ROOT / "scripts"))
    import gen_sglang_flags as g

    sys.meta_path.append(g._StubFinder({"dynamo"}))  # last: only dynamo.* modules the wheel lacks
    from dynamo.common.configuration.groups.router_args import add_worker_router_arguments
    from dynamo.common.configuration.groups.runtime_args import DynamoRuntimeArgGroup
    from dynamo.sglang.backend_args import DynamoSGLangArgGroup

    groups = {"runtime": DynamoRuntimeArgGroup().add_arguments, "sglang-worker": DynamoSGLangArgGroup().add_arguments,
              "router": add_worker_router_arguments}
    flags: list[dict[str, Any]] = []
    for group, add in groups.items():
        parser = argparse.ArgumentParser(add_help=False)
        add(parser)
        for action in parser._actions:
            names = [o for o in action.option_strings if o.startswith("--")]
            if names:
                flags.append({"names": names, "takes": _arity(action), "group": group})
    try:  # _compat imports the installed SGLang (the bare triton stand-in suffices)
        g.install_triton_stub()
        from dynamo.sglang._compat import add_sglang_cli_compat

        probe = argparse.ArgumentParser(add_help=False)
        probe.add_argument("--cuda-graph-backend-prefill")
        before = set(probe._option_string_actions)
        add_sglang_cli_compat(probe)
        for action in probe._actions:
            names = [o for o in action.option_strings if o not in before]
            if names:
                flags.append({"names": names, "takes": _arity(action), "group": "sglang-compat"})
    except ImportError:
        pass
    return {"flags": flags}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default=VERSION, help="ai-dynamo release")
    ap.add_argument("--wheels", type=Path, default=Path(os.environ.get("SGLANG_WHEELS", "/work/wheels")))
    ap.add_argument("--work", type=Path, default=Path("/tmp/dynamo-release"))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        sys.stdout.write(json.dumps(child_main(args.child)))
        return 0
    found = sorted(args.wheels.glob(f"ai_dynamo-{args.version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"ai-dynamo=={args.version}",
                        "-d", str(args.wheels)], check=True, stdout=subprocess.DEVNULL)
        found = sorted(args.wheels.glob(f"ai_dynamo-{args.version}-*.whl"))
    dest = args.work / args.version
    if not (dest / "dynamo").exists():
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(found[0]) as z:
            z.extractall(dest, [n for n in z.namelist() if n.startswith("dynamo/")])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, __file__, "--child", str(dest)], capture_output=True, text=True,
                          timeout=300, env=env)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return 1
    data = {"ai_dynamo": args.version, "generator": "scripts/gen_dynamo_flags.py", **json.loads(proc.stdout)}
    args.out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(data['flags'])} Dynamo flags of ai-dynamo {args.version}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
