"""The small-row kernel behind one seam (engine/ops.py), its ctypes bindings made from one table.

- `smallgemm.SIGNATURES` is the C prototypes of smallgemm.c, argument by argument (names, scalar types,
  pointer element types) and no entry point more or less;
- a ctypes mirror of a C struct whose size differs from the library's refuses the kernel with one log line,
  and the engine runs torch's forms;
- only engine/ops.py (and the kernel's own module) imports the kernel;
- `ops.paths` switches the engine to torch's forms or to the kernel op by op: no kernel entry point runs
  under kernel=False, and no fused one under fused=False, through a forward, a draft chain and sampling.
"""

from __future__ import annotations

import ast
import ctypes
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from specctl.engine import ops, smallgemm
from specctl.engine.model_runner import ForwardItem, ModelRunner
from specctl.engine.sampling import SamplingParams, sample

from test_model_hf import VOCAB, write_hf_model  # isort: skip

ROOT = Path(smallgemm.__file__).resolve().parent.parent
needs_cc = pytest.mark.skipif(shutil.which("cc") is None or os.environ.get("SPECCTL_SMALL_GEMM", "1") == "0",
                              reason="no small-row kernel here (no C compiler, or SPECCTL_SMALL_GEMM=0)")

# C parameter types -> the table's kinds that may pass them
_SCALARS = {"int": {"int"}, "long": {"long"}, "float": {"float"}}
_POINTEES = {"int": {"ptr", "int[]"}, "long": {"ptr", "long[]"}, "float": {"ptr", "float[]"},
             "unsigned char": {"ptr"}, "lone_layer": {"layers"}}


def c_prototypes() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """smallgemm.c's exported functions: name -> (return type, [(C type, argument name), ...])."""
    src = smallgemm.SOURCE.read_text()
    out: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    for m in re.finditer(r"^(int|void|long) specctl_(\w+)\(([^)]*)\)\s*\{", src, re.M):
        args = " ".join(m.group(3).split())
        params: list[tuple[str, str]] = []
        for arg in ([] if args == "void" else args.split(", ")):
            found = re.fullmatch(r"(?:const )?(.+?)\s*(\*?)\s*(\w+)", arg)
            assert found is not None, arg
            base, star, name = found.groups()
            params.append((f"{base} *" if star else base, name))
        out[m.group(2)] = (m.group(1), params)
    return out


def test_the_signature_table_is_the_c_prototypes() -> None:
    protos = c_prototypes()
    assert sorted(protos) == sorted(smallgemm.SIGNATURES), "an entry point is missing from one side"
    for name, text in smallgemm.SIGNATURES.items():
        ret, args = smallgemm.parse_signature(text)
        c_ret, c_args = protos[name]
        assert ret == c_ret, name
        assert [a for _, a in args] == [a for _, a in c_args], f"{name}: argument names or order differ"
        for (kind, arg), (ctype, _) in zip(args, c_args, strict=True):
            allowed = _POINTEES[ctype[:-2]] if ctype.endswith(" *") else _SCALARS[ctype]
            assert kind in allowed, f"{name}({arg}): C {ctype} passed as {kind}"


def test_a_table_entry_parses_into_names_and_kinds() -> None:
    assert smallgemm.parse_signature("int ()") == ("int", [])
    assert smallgemm.parse_signature("void (int M, ptr x, long[] base)") == (
        "void", [("int", "M"), ("ptr", "x"), ("long[]", "base")])


@needs_cc
def test_a_struct_mirror_of_the_wrong_size_refuses_the_kernel(monkeypatch, caplog) -> None:
    good = smallgemm._load()  # the user cache's build (the one this session's kernel() loaded)
    assert good is not None  # the real mirror matches the C struct
    lib = ctypes.CDLL(str(good.path))
    smallgemm.check_structs(lib, smallgemm.STRUCTS)

    class Drifted(ctypes.Structure):  # a field dropped on the Python side only
        _fields_ = [(name, ctypes.c_void_p) for name in ("norm1", "wqkv", "bqkv", "wo", "norm2", "wgu", "wd", "kpool")]

    with pytest.raises(smallgemm.KernelMismatch, match="lone_layer is 72 bytes in C but its ctypes mirror Drifted"):
        smallgemm.check_structs(lib, {"lone_layer": Drifted})
    monkeypatch.setattr(smallgemm, "STRUCTS", {"lone_layer": Drifted})
    with caplog.at_level(logging.INFO, logger=smallgemm.__name__):
        assert smallgemm._load() is None
    lines = [r for r in caplog.records if r.name == smallgemm.__name__]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "lone_layer" in lines[0].getMessage() and "using torch's kernels" in lines[0].getMessage()


def test_only_the_ops_seam_imports_the_kernel() -> None:
    importers = []
    for path in sorted((ROOT / "engine").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n.startswith("specctl.engine.smallgemm") for n in names):
                importers.append(path.relative_to(ROOT).as_posix())
    assert sorted(set(importers)) == ["engine/ops.py"]


@needs_cc
def test_paths_switch_the_engine_to_torch_or_to_the_kernel_op_by_op(tmp_path, monkeypatch) -> None:
    """kernel=False: no kernel entry point runs (forward, draft chain, sampling); fused=False: the kernel's
    matmuls and norms run but neither whole-layer nor whole-chain call; the three give the same tokens."""
    calls: list[str] = []
    for name in ("linear", "rms_norm", "attention", "full_layers", "lone_chains", "argmax", "sample"):
        real = getattr(smallgemm.SmallGemm, name)

        def spy(self: smallgemm.SmallGemm, *a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls.append(_name)
            return _real(self, *a, **kw)

        monkeypatch.setattr(smallgemm.SmallGemm, name, spy)
    write_hf_model(tmp_path / "m", "llama")
    runner = ModelRunner(str(tmp_path / "m"), page_size=4, max_tokens=256, max_requests=4)
    prompt = torch.randint(3, VOCAB, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    params = [SamplingParams(temperature=0.8)]

    def run(rid: int) -> tuple[list[int], list[int]]:
        runner.allocate(rid, 64)
        logits = runner.forward([ForwardItem(rid, prompt, 0)])
        step = runner.forward([ForwardItem(rid, [5], len(prompt))])
        drawn = sample(step[-1:], params, [torch.Generator().manual_seed(3)])
        chain = runner.draft_chain([rid], [[int(drawn[0])]], [3])
        assert chain is not None
        return [int(ops.argmax(logits[-1]))] + drawn.tolist(), chain[0]

    calls.clear()
    with ops.paths(kernel=False):
        torch_tokens = run(1)
    assert calls == []
    with ops.paths(fused=False):
        per_op = run(2)
    assert {"linear", "rms_norm", "attention", "argmax", "sample"} <= set(calls)
    assert "full_layers" not in calls and "lone_chains" not in calls
    calls.clear()
    fused = run(3)
    assert {"full_layers", "lone_chains"} <= set(calls)
    assert torch_tokens == per_op == fused
    assert ops.kernel() is smallgemm.kernel()  # the switches are restored
