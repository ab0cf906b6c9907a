"""CacheLayout: what a loaded model's caches hold, in the terms the PD handshake compares.

Contract: `ModelRunner.layout()` returns one frozen `CacheLayout`, derived from the live caches (never from
the config alone). Item lengths are bytes: `kv_item_lens` is one page of K and V per full-attention layer,
`state_item_lens` one request's state per state type (all its layers), `state_dims` the shape of that item.
`shapes` and `tokenizer` are optional extras (the model's facts fill the gaps in the registration).
`from_json` reads the same fields from a JSON object (a parse edge: a layout written by another process).

Torch-free: the registration (engine/pd/registration.py) builds from it without importing torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specctl.errors import InvalidInput


@dataclass(frozen=True)
class CacheLayout:
    page_size: int
    dtype: str  # "float32", "bfloat16", ... (no "torch." prefix)
    kv_item_lens: tuple[int, ...]
    state_types: tuple[str, ...]
    state_item_lens: tuple[int, ...]
    state_dims: tuple[tuple[int, ...], ...]
    weights_hash: str
    architecture: str
    layer_kinds: tuple[str, ...]
    vocab_size: int
    shapes: Mapping[str, int] = field(default_factory=dict)
    tokenizer: str = ""  # "" = derive from the model's files

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CacheLayout:
        """A layout from its JSON form (the field names above); InvalidInput naming a missing field."""
        try:
            return cls(
                page_size=int(doc["page_size"]),
                dtype=str(doc["dtype"]).removeprefix("torch."),
                kv_item_lens=tuple(int(x) for x in doc.get("kv_item_lens") or ()),
                state_types=tuple(str(t) for t in doc.get("state_types") or ()),
                state_item_lens=tuple(int(x) for x in doc.get("state_item_lens") or ()),
                state_dims=tuple(tuple(int(d) for d in ds) for ds in doc.get("state_dims") or ()),
                weights_hash=str(doc.get("weights_hash") or ""),
                architecture=str(doc.get("architecture") or ""),
                layer_kinds=tuple(str(k) for k in doc.get("layer_kinds") or ()),
                vocab_size=int(doc.get("vocab_size") or 0),
                shapes={str(k): int(v) for k, v in dict(doc.get("shapes") or {}).items()},
                tokenizer=str(doc.get("tokenizer") or ""),
            )
        except KeyError as exc:
            raise InvalidInput(f"cache layout: missing field {exc.args[0]!r}",
                               hint="write page_size and dtype at least") from None
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"cache layout: {exc}", hint="numbers must be integers") from None

    def to_json(self) -> dict[str, Any]:
        """The JSON form `from_json` reads back."""
        return {
            "page_size": self.page_size, "dtype": self.dtype, "kv_item_lens": list(self.kv_item_lens),
            "state_types": list(self.state_types), "state_item_lens": list(self.state_item_lens),
            "state_dims": [list(d) for d in self.state_dims], "weights_hash": self.weights_hash,
            "architecture": self.architecture, "layer_kinds": list(self.layer_kinds), "vocab_size": self.vocab_size,
            "shapes": dict(self.shapes), "tokenizer": self.tokenizer,
        }  # fmt: skip
