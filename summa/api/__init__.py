"""The calls a user makes.

``summa.matmul`` on DistMatrix or NumPy arrays (:mod:`summa.api.multiply`;
the arrays as the caller passed them, described, planned and given back
by :mod:`summa.api.planned`), the ``.npy`` file workflow
(:mod:`summa.api.files`), the stateful :class:`summa.Matmul` (plan once,
execute many, free), the arrays a caller may pass (:mod:`summa.api.arrayview`,
:mod:`summa.api.operands`, :mod:`summa.api.promotion`,
:mod:`summa.api.stacks`), and the verification of a product (gauge and
Freivalds' test). Each entry point is check, plan,
run, verify or write: the checks and decisions are the planner's
(:mod:`summa.planning`), the runs the executors' (:mod:`summa.execution`).
"""
