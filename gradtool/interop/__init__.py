"""Importers of models from other frameworks into gradtool tapes.

* :mod:`gradtool.interop.torch` -- a PyTorch module (through ``torch.export``) into a
  :class:`~gradtool.tape.Tape` and a tape file, and trained weights back into the module.
  Beside it: :mod:`~gradtool.interop.export` (the export step), :mod:`~gradtool.interop.problems`
  (the one error), :mod:`~gradtool.interop.result` (:class:`TorchImport`),
  :mod:`~gradtool.interop.weights` (``load_weights``), :mod:`~gradtool.interop.verify`
  (the check against torch), :mod:`~gradtool.interop.wrap` (your own loop).
* :mod:`gradtool.interop.aten` -- the one mapping table from ATen ops to Tape recordings,
  one module per family, with the :class:`~gradtool.interop.aten.recorder.Recorder` its
  entries record through (importable without torch; ``docs/torch.md``'s op table is
  generated from it).

Nothing here imports torch until an import actually runs.
"""
