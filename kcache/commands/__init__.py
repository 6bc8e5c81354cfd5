"""The ``kcache`` subcommands, one module per group; :data:`kcache.cli.COMMANDS` registers them.

Each command is a pair ``NAME_args(parser)`` (its own options) and ``NAME_run(args) -> int``
(the first line of its docstring is the command's help). Shared pieces are in :mod:`.base`.
"""
