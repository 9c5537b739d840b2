"""Where the ranks are and which rank owns which block.

The nodes of a communicator's ranks (:mod:`summa.distribution.topology`),
the Cartesian process grid and its row and column communicators, the
block and block-cyclic index maths (no MPI), and :class:`summa.DistMatrix`:
scatter, gather, random, transpose.
"""
