"""Importers of models from other frameworks into gradtool tapes.

* :mod:`gradtool.interop.torch` -- a PyTorch module (through ``torch.export``) into a
  :class:`~gradtool.tape.Tape` and a tape file, and trained weights back into the module.
* :mod:`gradtool.interop.aten` -- the one mapping table from ATen ops to Tape recordings
  (importable without torch; ``docs/torch.md``'s op table is generated from it).

Nothing here imports torch until an import actually runs.
"""
