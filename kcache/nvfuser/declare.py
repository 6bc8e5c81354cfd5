"""What kcache must know of the nvFuser integration before it is imported (read by
:mod:`kcache.registry` at start-up, without importing the package: this module imports nothing).
"""

INTEGRATION = "kcache.nvfuser:INTEGRATION"
SWITCH = "nvfuser"
TRIGGERS = ("nvfuser_direct", "nvfuser")

NVFUSER = "nvfuser"
NVFUSER_MANIFEST = "nvfuser-manifest"
NVFUSER_LEGACY = "nvfuser-legacy"
#: Counter-only (no entries): the nvFuser fusion cache's in-process hits and misses.
NVFUSER_FUSION = "nvfuser-fusion"

KINDS = {
    NVFUSER: ("a compiled nvFuser kernel (CUDA source and cubin)", ()),
    NVFUSER_MANIFEST: ("the list of nvFuser kernels of one toolchain fingerprint", ()),
    NVFUSER_LEGACY: ("a serialized legacy nvFuser FusionCache", ()),
    NVFUSER_FUSION: ("nvFuser's fusion cache hits and misses in a process", ("counter_only",)),
}

COMPONENTS = {
    "nvfuser_version": "kcache.nvfuser.identity:nvfuser_version",
    "nvrtc": "kcache.nvfuser.identity:nvrtc",
}
VERSIONS = ("nvfuser_version",)
#: Its fingerprint reads torch's version and CUDA runtime, which the torch integration declares.
USES = ("torch",)

IDENTITY = "kcache.nvfuser.identity:parts"
WORDS = {"nvfuser_version": "nvFuser build"}
KEYED_BY = {NVFUSER: ("nvfuser_version",)}

#: Its fusion cache counts hits without a lock: pushed to kcache's counters before stats and at exit.
AT_EXIT = "kcache.nvfuser.fusion_cache:flush_all"
