"""`cuda_library`: compiles .cu files with nvcc and wraps the objects in a cc_library.

Device code is built for Hopper (`sm_90a`, needed by wgmma/TMA kernels) plus PTX for
`compute_80` so the same binary also loads on Ampere and newer GPUs (Hopper-only kernels are
guarded by `__CUDA_ARCH_FEAT_SM90_ALL` and compile to empty bodies in the PTX). Include paths and
defines of `deps` are passed to nvcc, so a .cu file includes project, Abseil, CUTLASS and proto
headers exactly as a .cc file would.
"""

_NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-lineinfo",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-Wno-deprecated-declarations",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_80,code=compute_80",
    "-DNDEBUG",
]

def _cuda_objects_impl(ctx):
    cc = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps]).compilation_context
    flags = []
    for inc in [".", ctx.bin_dir.path, ctx.genfiles_dir.path] + cc.includes.to_list() + cc.quote_includes.to_list():
        flags.append("-I" + inc)
    for inc in cc.system_includes.to_list():
        flags += ["-isystem", inc]
    for d in cc.defines.to_list():
        flags.append("-D" + d)
    nvcc = ctx.file._nvcc_path
    outs = []
    for src in ctx.files.srcs:
        out = ctx.actions.declare_file("_cuda_objs/%s/%s.pic.o" % (ctx.label.name, src.basename[:-3]))
        ctx.actions.run_shell(
            inputs = depset([src, nvcc] + ctx.files.hdrs, transitive = [cc.headers]),
            outputs = [out],
            command = '"$(cat %s)" "$@"' % nvcc.path,
            arguments = _NVCC_FLAGS + ctx.attr.copts + flags + ["-c", src.path, "-o", out.path],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        outs.append(out)
    return [DefaultInfo(files = depset(outs))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "_nvcc_path": attr.label(default = "@cuda//:nvcc_path", allow_single_file = True),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc (see file comment)."""
    all_deps = deps + ["@cuda//:runtime"]
    _cuda_objects(
        name = name + "_cuda_objs",
        srcs = srcs,
        hdrs = hdrs,
        deps = all_deps,
        copts = copts,
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_cuda_objs"],
        hdrs = hdrs,
        deps = all_deps,
        alwayslink = True,
        linkstatic = True,
        **kwargs
    )
