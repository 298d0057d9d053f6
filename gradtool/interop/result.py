"""What :func:`~gradtool.interop.torch.import_module` returns: :class:`TorchImport`."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from ..ops import dtype_of


@dataclass
class TorchImport:
    """What :func:`import_module` recorded: the tape, its loss, named outputs, and the
    torch names of params, input slots and consts (each a GVar)."""
    tape: Any
    loss: Any
    outputs: dict
    params: dict
    inputs: dict
    consts: dict
    histogram: collections.Counter
    input_dtypes: dict
    state: dict = field(default_factory=dict)     # buffer name -> output name (the same)
    out_spec: Any = None          # the pytree structure of the module's outputs (torch's)
    out_dtypes: list = field(default_factory=list)  # each user output's exported dtype
    out_shapes: list = field(default_factory=list)  # ... and shape (a 0-dim loss: [])
    notes: list = field(default_factory=list)     # what the import did that one should know
    check: dict = field(default_factory=dict)     # an f32 import's check (_as_f32)

    def meta(self) -> dict:
        return {"torch": {
            "params": {k: v.id for k, v in self.params.items()},
            "inputs": {k: {"node": v.id, "dtype": self.input_dtypes[k]}
                       for k, v in self.inputs.items()},
            "consts": {k: v.id for k, v in self.consts.items()},
        }}

    def save(self, path, meta=None) -> None:
        """Write the tape file (atomically: a path is replaced whole or not at all).

        ``meta``: further meta entries (``{"train": {...}}`` training defaults) next to
        ``meta["torch"]`` (the torch names of params, input slots and consts)."""
        from ..tapefile import save
        save(self.tape, path, loss=self.loss, outputs=self.outputs or None,
             meta={**self.meta(), **(meta or {})}, state=self.state or None)

    def summary(self) -> dict:
        tp = self.tape
        return {
            "params": {k: list(tp.values[v.id].shape) for k, v in self.params.items()},
            "param_count": int(sum(tp.values[v.id].size for v in self.params.values())),
            "inputs": {k: {"shape": list(tp.values[v.id].shape),
                           "dtype": dtype_of(tp.values[v.id])}
                       for k, v in self.inputs.items()},
            "consts": sorted(self.consts),
            "state": sorted(self.state),
            "outputs": sorted(self.outputs),
            "nodes": len(tp.nodes),
            "aten_ops": dict(sorted(self.histogram.items())),
            "unsupported": [],
            "notes": list(self.notes),
        }
