"""Weights back: the trained params (and state buffers) of a tape or tape file into the
torch module, by name, each rounded to the parameter's own dtype."""

from __future__ import annotations

import numpy as np

from .problems import WeightsError, Problems
from .result import TorchImport


# ── weights back ───────────────────────────────────────────────────────────

def load_weights(module, tape_or_file) -> list:
    """Copy a tape's (or a tape file's) params into ``module`` by state_dict name, cast to
    each parameter's dtype; its state slots (batch norm's running statistics, as
    ``gradtool train`` left them) go into the buffers of their names, cast to each
    buffer's dtype (``num_batches_tracked`` back to int64, exactly).  A file without a
    ``state`` map (written before it existed) gives its buffers from the named outputs
    of the buffers' names, as before.

    ``tape_or_file``: a path, a :class:`~gradtool.tapefile.TapeFile`, a
    :class:`TorchImport`, or a Tape whose params carry the torch names.  Refuses
    (TorchImportError, nothing copied) a param of the tape the module lacks, a
    module param the tape lacks, or a shape that differs, naming each.  Returns
    the names copied.
    """
    import torch
    from ..tape import Tape
    from ..tapefile import TapeFile, load
    outputs, state = {}, {}
    if isinstance(tape_or_file, TorchImport):
        tape, outputs, state = tape_or_file.tape, tape_or_file.outputs, tape_or_file.state
    elif isinstance(tape_or_file, Tape):
        tape = tape_or_file
    elif isinstance(tape_or_file, TapeFile):
        tape, outputs, state = tape_or_file.tape, tape_or_file.outputs, tape_or_file.state
    else:
        tf = load(tape_or_file)
        tape, outputs, state = tf.tape, tf.outputs, tf.state
    values = {tape.nodes[v.id].name: tape.values[v.id] for v in tape.params()}
    named = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    bufvals = {}
    if state:                     # the state slots hold the trained buffers
        slots = {n.name: i for i, n in enumerate(tape.nodes) if n.op == "const" and n.name}
        bufvals = {k: tape.values[slots[k]] for k in state if k in buffers and k in slots}
    else:
        for k, v in (outputs or {}).items():
            if k in buffers:
                i = v if isinstance(v, int) else v.id
                bufvals[k] = tape.values[i]
    trainable = {k for k, p in named.items() if p.requires_grad}
    problems = Problems()
    for k in values:
        if k not in named:
            problems.add("tape params not in the module:", repr(k))
        elif tuple(named[k].shape) != values[k].shape and not (
                named[k].dim() == 0 and values[k].shape == (1,)):
            problems.add("shape mismatch for", repr(k), detail=f"the module has "
                         f"{list(named[k].shape)}, the tape {list(values[k].shape)}")
    for k, arr in bufvals.items():
        if buffers[k].numel() != arr.size:
            problems.add("shape mismatch for", repr(k), detail=f"the module's buffer has "
                         f"{list(buffers[k].shape)}, the tape {list(arr.shape)}")
    for k in (k for k in named if k in trainable):     # in the module's order
        if k not in values:
            problems.add("module params not in the tape:", repr(k))
    if problems:
        raise problems.error(WeightsError)
    with torch.no_grad():
        for k, arr in values.items():
            p = named[k]
            p.copy_(torch.from_numpy(np.array(arr)).reshape(p.shape).to(p.dtype))
        for k, arr in bufvals.items():
            b = buffers[k]
            b.copy_(torch.from_numpy(np.array(arr)).reshape(b.shape).to(b.dtype))
    return list(values) + list(bufvals)
