"""Record the tiny GPT (model.py) through the PyTorch importer.

    python samples/tiny_gpt/record.py [OUTDIR]    # writes tiny_gpt.msgpack + tokens.npz

The tape is what ``gradtool import-torch samples/tiny_gpt/model.py:build --dtype f64`` writes,
plus training defaults in its meta (Adam, lr 3e-3); ``tokens.npz`` holds every
example window of ``sonnets.txt`` (``idx`` and ``targets``, int64 [N, 16]), so

    gradtool train samples/tiny_gpt/tiny_gpt.msgpack --data samples/tiny_gpt/tokens.npz

trains it (``README.md`` here: on cpu and host to the same bytes, over MPI, and the
weights back into torch).  torch's seeded CPU initialisation makes the files
reproducible byte for byte under the pinned torch.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))

from model import build, dataset                               # noqa: E402

from gradtool.interop.torch import import_module               # noqa: E402
from gradtool.npzio import write_npz                           # noqa: E402


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else HERE
    out.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore")
    model, inputs = build()
    result = import_module(model, inputs, dtype="f64")
    result.save(out / "tiny_gpt.msgpack",
                meta={"train": {"optimizer": "adam", "lr": 3e-3}})
    _, idx, tgt = dataset()
    write_npz(out / "tokens.npz", {"idx": idx, "targets": tgt})
    n = sum(result.tape.values[p.id].size for p in result.params.values())
    print(f"wrote {out / 'tiny_gpt.msgpack'} ({len(result.params)} params, {n} values, "
          f"{len(result.tape.nodes)} nodes) and {out / 'tokens.npz'} ({len(idx)} examples)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
