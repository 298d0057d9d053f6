"""What is recorded from the op table's ops, by family, usable from ``gt.Tape`` without torch.

* :mod:`gradtool.composites.math` -- sinh, cosh, asinh, acosh, atanh, hypot, tan, exp2,
  log2, log10
* :mod:`gradtool.composites.distances` -- cdist, pdist

(A minimal package init: helper "comp" creates the package's other families and its
full init; the lead merges the two.)
"""
