"""What kcache must know of prewarm's part in a program (:mod:`.integration`) before it is
imported (read by :mod:`kcache.registry` at start-up, without importing the package: this module
imports nothing). It keeps no kinds of its own (its memos are the machine-local kind,
:data:`kcache.kinds.TRITON_META`) and attaches with Triton, on Triton's switch."""

INTEGRATION = "kcache.prewarm.integration:INTEGRATION"
SWITCH = "triton"
TRIGGERS = ("triton",)
#: It compiles and records Triton kernels (it reads the Triton integration's components), and
#: runs a spec's nvFuser fusions through the nvFuser integration's ``FusionCache``.
USES = ("triton", "nvfuser")
