"""Small ``@triton.jit`` kernels for kcache's Triton tests and benchmarks.

Each module holds one kind of kernel; :mod:`kernels.specs` says how each is compiled ahead of time
(``triton.compile(ASTSource(...), target=GPUTarget(...))``, which needs no GPU) and
:mod:`kernels.run` compiles a set of them in a fresh process and reports what happened. The tests
put ``tests/`` on ``PYTHONPATH`` so that subprocesses import this package as ``kernels``.
"""
