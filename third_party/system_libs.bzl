"""Exposes Debian's system libraries as cc_library targets under @sys//:<name>.

Each library's link flags and defines come from `pkg-config` at fetch time, so the build follows
whatever versions tools/setup.sh installed. Headers live in /usr/include, which the auto-configured
C++ toolchain already searches, so the targets carry flags only. Libraries that ship no .pc file
(Gloo, gRPC reflection) are listed with explicit flags.
"""

# name -> pkg-config modules.
_PKG_CONFIG = {
    "absl": [
        "absl_status",
        "absl_statusor",
        "absl_strings",
        "absl_str_format",
        "absl_synchronization",
        "absl_time",
        "absl_flags",
        "absl_flags_parse",
        "absl_flags_usage",
        "absl_hash",
        "absl_raw_hash_set",
    ],
    "protobuf": ["protobuf"],
    "grpc": ["grpc++"],
    "prometheus": ["prometheus-cpp-pull", "prometheus-cpp-core"],
    "json": ["nlohmann_json"],
    "yaml_cpp": ["yaml-cpp"],
    "httplib": ["cpp-httplib"],
    "openssl": ["openssl"],
    "sqlite3": ["sqlite3"],
    "gtest": ["gtest"],
    "gmock": ["gmock"],
    "gtest_main": ["gmock", "gtest_main"],
}

# name -> (linkopts, deps) for libraries without a pkg-config file.
_MANUAL = {
    "gloo": (["-L/usr/lib", "-lgloo", "-lpthread"], []),
    "grpc_reflection": (["-Wl,--no-as-needed", "-lgrpc++_reflection", "-Wl,--as-needed"], [":grpc"]),
}

def _pkg_config(ctx, flag, modules):
    res = ctx.execute(["pkg-config", flag] + modules)
    if res.return_code != 0:
        fail("pkg-config %s %s failed (run tools/setup.sh first):\n%s" %
             (flag, " ".join(modules), res.stderr))
    return [f for f in res.stdout.strip().split(" ") if f]

def _dedup(flags):
    out = []
    for f in flags:
        if f not in out or not f.startswith("-l"):
            out.append(f)
    return out

def _system_libs_impl(ctx):
    lines = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, modules in _PKG_CONFIG.items():
        libs = _dedup(_pkg_config(ctx, "--libs", modules))
        cflags = _pkg_config(ctx, "--cflags", modules)
        defines = [f[2:] for f in cflags if f.startswith("-D")]
        lines.append("cc_library(name = %r, linkopts = %r, defines = %r)" % (name, libs, defines))
    for name, (linkopts, deps) in _MANUAL.items():
        lines.append("cc_library(name = %r, linkopts = %r, deps = %r)" % (name, linkopts, deps))
    ctx.file("BUILD", "\n".join(lines) + "\n")
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)

system_libs = repository_rule(
    implementation = _system_libs_impl,
    local = True,
    environ = ["PKG_CONFIG_PATH"],
)

def _cutlass_impl(ctx):
    """Links the CUTLASS headers of the pinned nvidia-cutlass wheel into @cutlass//:cutlass."""
    res = ctx.execute([
        "python3",
        "-c",
        "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))",
    ])
    if res.return_code != 0:
        fail("nvidia-cutlass is not installed (run tools/setup.sh):\n" + res.stderr)
    inc = res.stdout.strip()
    ctx.symlink(inc + "/cutlass", "include/cutlass")
    ctx.symlink(inc + "/cute", "include/cute")
    ctx.file("WORKSPACE", 'workspace(name = "cutlass")\n')
    ctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cutlass",
    hdrs = glob(["include/cutlass/**", "include/cute/**"]),
    includes = ["include"],
)
""")

cutlass_headers = repository_rule(implementation = _cutlass_impl, local = True)

def _cudnn_frontend_impl(ctx):
    """Links the headers of the pinned nvidia-cudnn-frontend wheel into @cudnn_frontend//:headers.

    The frontend is header-only. It is built in its dynamic-loading mode: nothing links against
    libcudnn; kernels/attention/attention_cudnn.cc dlopens libcudnn.so.9 at run time and falls
    back to Switchyard's own attention kernels when it is absent. JSON serialisation (which would
    pull in the wheel's own copy of nlohmann/json) is compiled out.
    """
    res = ctx.execute([
        "python3",
        "-c",
        "import importlib.metadata as m; print(m.distribution('nvidia-cudnn-frontend').locate_file('include'))",
    ])
    if res.return_code != 0:
        fail("nvidia-cudnn-frontend is not installed (run tools/setup.sh):\n" + res.stderr)
    inc = res.stdout.strip()
    if not ctx.path(inc + "/cudnn_frontend.h").exists:
        fail("nvidia-cudnn-frontend has no %s/cudnn_frontend.h (run tools/setup.sh)" % inc)
    ctx.symlink(inc, "include")
    ctx.file("WORKSPACE", 'workspace(name = "cudnn_frontend")\n')
    ctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
    defines = ["NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING", "CUDNN_FRONTEND_SKIP_JSON_LIB"],
)
""")

cudnn_frontend_headers = repository_rule(implementation = _cudnn_frontend_impl, local = True)

def _cuda_toolkit_impl(ctx):
    """Links the CUDA toolkit (headers, cuBLAS, NCCL, cudart) into @cuda."""
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    if not ctx.path(root + "/bin/nvcc").exists:
        fail("CUDA toolkit not found at %s (set CUDA_PATH)" % root)
    ctx.symlink(root + "/include", "include")
    ctx.symlink(root + "/lib64", "lib64")
    ctx.file("WORKSPACE", 'workspace(name = "cuda")\n')
    ctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

# Headers only: host code that declares CUDA types without launching anything.
cc_library(
    name = "headers",
    hdrs = glob(["include/*.h", "include/nvtx3/**", "include/crt/**", "include/cuda/**", "include/cccl/**"]),
    includes = ["include"],
)

# The CUDA runtime (static, so binaries need only the driver), cuBLAS and NCCL (shared: the GPU
# host provides them in /usr/local/cuda/lib64 and /usr/lib/x86_64-linux-gnu).
cc_library(
    name = "runtime",
    srcs = ["lib64/libcudart_static.a"],
    linkopts = [
        "-L{root}/lib64",
        "-Wl,--no-as-needed",
        "-lcublas",
        "-lcublasLt",
        "-lnccl",
        "-Wl,--as-needed",
        "-ldl",
        "-lrt",
        "-lpthread",
    ],
    deps = [":headers"],
)

filegroup(name = "nvcc", srcs = ["nvcc_path"])
""".format(root = root))
    ctx.file("nvcc_path", root + "/bin/nvcc\n")

cuda_toolkit = repository_rule(
    implementation = _cuda_toolkit_impl,
    local = True,
    environ = ["CUDA_PATH"],
)
