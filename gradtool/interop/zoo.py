"""The model zoos as they come: torchvision and Hugging Face transformers.

PyPI's torchvision wheels are CUDA builds. Beside a CPU torch their C extension
(`torchvision/_C.so`) does not load, and `import torchvision` then fails in its own
`_meta_registrations.py`, which registers fake kernels for `torchvision::nms` and
`torchvision::qnms` whether the extension loaded or not:
`RuntimeError: operator torchvision::nms does not exist`.

`import_torchvision()` defines the schemas of those two operators through
`torch.library` first (the schemas torchvision's C++ declares), without any kernel,
and then imports torchvision. No architecture uses them: they are the box ops of the
detection post-processing. A call to one raises torch's "no kernel" error, as it
would with the extension missing. When the extension does load (a matching wheel),
nothing is defined and torchvision is imported as it is.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys

# torchvision's C++ declarations (torchvision/csrc/ops/nms.cpp, quantized/qnms_kernel.cpp)
_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARY = None        # the torch.library.Library that holds the schemas (kept alive)


def _has_op(torch, name: str) -> bool:
    try:
        torch._C._dispatch_has_kernel_for_dispatch_key(f"torchvision::{name}", "Meta")
    except RuntimeError:          # "operator torchvision::nms does not exist"
        return False
    return True


def define_torchvision_ops():
    """Define the torchvision operators its import needs and a CPU wheel lacks.

    Idempotent; returns the names it defined (empty when torchvision's own extension
    already defines them)."""
    global _LIBRARY
    import torch
    if "torchvision" not in sys.modules:
        try:     # the extension, where it loads, defines the real ops
            spec = importlib.util.find_spec("torchvision")
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            import glob
            import os
            for so in glob.glob(os.path.join(spec.submodule_search_locations[0], "_C*.so")):
                try:
                    torch.ops.load_library(so)
                except (OSError, RuntimeError):
                    pass
    missing = [n for n in _SCHEMAS if not _has_op(torch, n)]
    if missing:
        if _LIBRARY is None:
            _LIBRARY = torch.library.Library("torchvision", "FRAGMENT")
        for name in missing:
            _LIBRARY.define(_SCHEMAS[name])
    return missing


def import_torchvision():
    """`import torchvision`, working beside a CPU torch (see the module docstring)."""
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    define_torchvision_ops()
    return importlib.import_module("torchvision")


def import_transformers():
    """`import transformers`, working beside a CPU torch: transformers imports
    torchvision where it is installed (its image utilities, loaded with the model
    classes), so the same two schemas are defined first."""
    if "transformers" in sys.modules:
        return sys.modules["transformers"]
    if importlib.util.find_spec("torchvision") is not None:
        define_torchvision_ops()
    return importlib.import_module("transformers")


def prepare_torchvision() -> list:
    """Where torchvision is installed and not yet imported, define the schemas its
    import needs (:func:`define_torchvision_ops`), so that a user's own
    ``import torchvision`` or ``import transformers`` works beside a CPU torch
    (``gradtool import-torch`` calls this before it runs the user's file)."""
    if "torchvision" in sys.modules:
        return []
    try:
        found = importlib.util.find_spec("torchvision") is not None
    except (ImportError, ValueError):
        found = False
    return define_torchvision_ops() if found else []
