"""gradtool.rowtext: rows written by columns are the rows Python's own formatting writes."""

import numpy as np

from gradtool import rowtext

EDGES = np.array([0, 1, 9, 10, 99, 100, -1, -9, -10, -99, -100, 12345, 1048575,
                  *[10 ** k for k in range(19)], *[10 ** k - 1 for k in range(1, 19)],
                  *[-10 ** k for k in range(19)], *[1 - 10 ** k for k in range(1, 19)]],
                 dtype=np.int64)


def text(n, fields, sep="\n", others=None) -> str:
    return b"".join(rowtext.render(n, fields, sep, others or {})).decode("ascii")


def test_integers_are_str_and_percent_star_d_in_every_width():
    for values in (EDGES, np.arange(-5, 200_000), np.array([], dtype=np.int64)):
        for width in (0, 1, 2, 3, 7, 8, 9, 12, 20, 21):
            got = text(len(values), [rowtext.integers(values, width=width)], ",")
            assert got == ",".join("%*d" % (width, v) for v in values.tolist()), width


def test_fields_side_by_side_with_rows_put_in_at_their_place():
    v = EDGES
    n = len(v)
    codes = np.arange(n) % 3
    fields = [rowtext.const("<"), rowtext.integers(v), rowtext.lookup(["ab", "c", ""], codes),
              rowtext.when(rowtext.const("!"), v < 0), rowtext.when(rowtext.integers(v), v > 50),
              rowtext.pad(np.arange(n) % 4), rowtext.const(">")]

    def row(i, x):
        return (f"<{x}{['ab', 'c', ''][i % 3]}{'!' if x < 0 else ''}{x if x > 50 else ''}"
                f"{' ' * (i % 4)}>")

    for others in ({}, {0: b"first"}, {3: b"\xc3\xa9", n - 1: b"last"}, {i: b"x" for i in range(n)}):
        got = b"".join(rowtext.render(n, fields, ", ", others))
        want = ", ".join(others[i].decode() if i in others else row(i, x)
                         for i, x in enumerate(v.tolist()))
        assert got.decode() == want
