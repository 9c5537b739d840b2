"""The calls a user makes.

``summa.matmul`` on DistMatrix or NumPy arrays (:mod:`summa.api.multiply`,
each product of arrays planned and run by :mod:`summa.api.planned`), the
``.npy`` file workflow (:mod:`summa.api.files`), the stateful
:class:`summa.Matmul` (plan once, execute many, free), the checks of
operands, scalars and arrays that every rank makes alike before any message,
and the verification of a product (gauge and Freivalds' test). Each entry
point is check, plan, run, verify or write; the decisions are the planner's
(:mod:`summa.planning`).
"""
