"""The one shared test-support module: tests import helpers from here, never from
each other.  The helpers live in modules by what they serve; this one gathers their
names, so ``from support import NAME`` works for every one of them:

* :mod:`support_tapes`: the repository's paths and samples, per-op inputs from the op
  table (:func:`op_case`, :func:`op_tape`), the graph builders (:func:`random_graph`,
  :func:`random_unary`, :func:`mlp`, :func:`mlp_tape`, :func:`all_ops_tape`,
  :func:`write_independent_mlp` and numpy backprop to check it).
* :mod:`support_backends`: engines and compiled code against the tape
  (:func:`with_params`, :func:`run_cpu`, :func:`assert_replay_trained_like_cpu`,
  :func:`assert_engines_end_alike`, :func:`host_matches` in every kernel variant,
  :func:`assert_emitted_c_equals_tape`, the PTX FMA contract, :func:`run_no_fma`).
* :mod:`support_emit`: emitted C and CUDA against the tape (the C compiler, nvcc, the
  tape's bits of an emitted function, one C program run, the oracle script).
* :mod:`support_files`: tape files, valid and hostile (:func:`all_invalid_cases`,
  :func:`assert_clean_reject`, the fuzz test's :class:`Mutator`).
* :mod:`support_cli`: the command line (:func:`run`, :func:`assert_one_line_error`,
  :func:`run_limited`, :func:`stderr_through_a_terminal`, :func:`train_under_mpiexec`).
* :mod:`support_oracle`: ours against PyTorch float64 element by element
  (:func:`torch_oracle`, :func:`check_unary`, :func:`check_specials`).
* :mod:`support_fdlibm`: fdlibm's inputs, bit views, accuracy and parity helpers.
* :mod:`support_matmul`: the CPU library's builds, their products and operand layouts,
  the FMA instructions in a library's disassembly.

The importer's torch models and checks are in tests/torch_cases.py (it needs torch).

Run as a script (``python tests/support.py cli-batch JOBS.json``) it is the fuzz
test's limited worker.
"""

from __future__ import annotations

import sys

from conftest import bits                  # noqa: F401  (the fdlibm tests' bit view)
from support_backends import *             # noqa: F401,F403
from support_cli import *                  # noqa: F401,F403
from support_cli import cli_batch
from support_emit import *               # noqa: F401,F403
from support_fdlibm import *               # noqa: F401,F403
from support_files import *                # noqa: F401,F403
from support_matmul import *               # noqa: F401,F403
from support_oracle import *               # noqa: F401,F403
from support_tapes import *                # noqa: F401,F403

if __name__ == "__main__":
    if sys.argv[1:2] == ["cli-batch"]:
        cli_batch(sys.argv[2])
