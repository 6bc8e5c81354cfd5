"""What kcache must know of the Triton integration before it is imported (read by
:mod:`kcache.registry` at start-up, without importing the package: this module imports nothing).

Its kinds, the parts of the machine's identity that enter their keys, and where its code is
(:mod:`.identity` computes its components; :data:`kcache.triton.INTEGRATION` attaches it).
"""

INTEGRATION = "kcache.triton:INTEGRATION"
SWITCH = "triton"
TRIGGERS = ("triton",)

KIND_GROUP = "triton"
KIND_AUTOTUNE = "triton-autotune"
KIND_AUX = "triton-aux"

KINDS = {
    KIND_GROUP: ("a compiled Triton kernel: its group of files (IR, binary, metadata)", ("inner",)),
    KIND_AUTOTUNE: ("Triton autotune timings and best config, for one GPU model", ()),
    KIND_AUX: ("a Triton launcher or utility shared object (host code)", ("host_code", "inner")),
}

COMPONENTS = {
    "triton_version": "kcache.triton.identity:triton_version",
    "ptxas": "kcache.triton.identity:ptxas",
}
VERSIONS = ("triton_version",)

IDENTITY = "kcache.triton.identity:parts"
WORDS = {
    "triton_version": "Triton build (version)",
    "libtriton_sha256": "Triton build (libtriton)",
    "ptxas": "ptxas (CUDA toolchain)",
    "path.triton": "a path in the key: Triton's folder",
    "path.libcuda": "a path in the key: libcuda's folder",
    "env.": "environment variable",
}
KEYED_BY = {
    KIND_GROUP: ("triton_version", "libtriton_sha256", "python_abi", "env.", "arch", "ptxas"),
    KIND_AUTOTUNE: ("triton_version", "libtriton_sha256", "gpu_name", "device"),
    KIND_AUX: ("triton_version", "python_abi", "path.triton", "path.libcuda"),
}
