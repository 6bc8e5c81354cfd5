"""What kcache must know of the torch.compile integration before it is imported (read by
:mod:`kcache.registry` at start-up, without importing the package: this module imports nothing).

Its kinds, the modules whose import attaches it, the parts of the machine's identity that enter
its keys, and where its code is (:mod:`.identity`; :data:`kcache.inductor.INTEGRATION`).
"""

INTEGRATION = "kcache.inductor:INTEGRATION"
SWITCH = "torch"

#: torch's config modules whose remote-cache switches kcache turns on (see ``FLAGS`` in the
#: package), then the modules kcache attaches to.
TRIGGERS = (
    "torch._inductor.config",
    "torch._functorch.config",
    "torch._dynamo.config",
    "torch._inductor.remote_cache",
    "torch._inductor.cpp_builder",
    "torch._dynamo.package",
    "torch._inductor.runtime.triton_heuristics",
    "torch._inductor.cpu_vec_isa",
    "torch._inductor.utils",
    "torch._inductor.codecache",
    "torch._functorch._aot_autograd.autograd_cache",
    "torch._dynamo.pgo",
    "torch._inductor.runtime.autotune_cache",
    "torch._inductor.compile_fx",
    "torch._functorch._aot_autograd.aot_autograd_result",
    "torch._functorch._aot_autograd.graph_compile",
    "torch._functorch.aot_autograd",
    "torch._inductor.async_compile",
    "torch._inductor.codegen.triton",
)

INDUCTOR_FX = "inductor-fx"
INDUCTOR_AOT = "inductor-aot"
INDUCTOR_AUTOTUNE = "inductor-autotune"
INDUCTOR_PGO = "inductor-pgo"
INDUCTOR_PRECOMPILE = "inductor-precompile"
INDUCTOR_CPP = "inductor-cpp"
INDUCTOR_OTHER = "inductor-other"
INDUCTOR_RESTART = "inductor-restart"

KINDS = {
    INDUCTOR_FX: ("an Inductor FX graph cache entry (torch pickle)", ("pickled",)),
    INDUCTOR_AOT: ("an AOTAutograd cache entry (torch pickle)", ("pickled",)),
    INDUCTOR_AUTOTUNE: ("Inductor autotune results and max-autotune choices", ()),
    INDUCTOR_PGO: ("Dynamo's profile of dynamic dimensions (automatic dynamic)", ("pickled",)),
    INDUCTOR_PRECOMPILE: ("a Dynamo caching-precompile artifact (torch pickle)", ("pickled",)),
    INDUCTOR_CPP: ("an Inductor CPU kernel: a C++ shared object (host code)", ("host_code", "inner")),
    INDUCTOR_OTHER: ("another torch.compile cache artifact (torch pickle)", ("pickled",)),
    INDUCTOR_RESTART: (
        "the floats Dynamo specialised when it restarted a graph's analysis (JSON)",
        ("signed_only",),
    ),
}

COMPONENTS = {
    "torch_version": "kcache.inductor.identity:torch_version",
    "torch_git": "kcache.inductor.identity:torch_git",
    "cuda_runtime": "kcache.inductor.identity:cuda_runtime",
}
VERSIONS = ("torch_version",)

IDENTITY = "kcache.inductor.identity:parts"
WORDS = {"torch_version": "torch build", "cuda_runtime": "CUDA runtime"}
KEYED_BY = {
    **{kind: ("torch_version",) for kind in KINDS},
    INDUCTOR_AUTOTUNE: ("torch_version", "gpu_name", "device"),
}
