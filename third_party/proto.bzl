"""`sy_proto_library`: protoc + grpc_cpp_plugin (the Debian binaries) as a reusable macro.

Generates `<x>.pb.{h,cc}` and, for files with services, `<x>.grpc.pb.{h,cc}`; the messages
become the cc_library `name` (Protobuf only) and the service stubs `name_grpc` (+ gRPC). Proto files are compiled relative to `import_root` (a directory inside the package),
so `import_root/switchyard/v1/job.proto` is included as "switchyard/v1/job.pb.h".
"""

def sy_proto_library(name, srcs, import_root = "", grpc_srcs = [], deps = [], **kwargs):
    pkg = native.package_name()
    root = (pkg + "/" + import_root).rstrip("/") if import_root else pkg
    prefix = import_root + "/" if import_root else ""
    outs = []
    for src in srcs:
        base = src[len(prefix):-len(".proto")]
        outs += [prefix + base + ".pb.h", prefix + base + ".pb.cc"]
        if src in grpc_srcs:
            outs += [prefix + base + ".grpc.pb.h", prefix + base + ".grpc.pb.cc"]
    rel = [s[len(prefix):] for s in srcs]
    rel_grpc = [s[len(prefix):] for s in grpc_srcs]
    gen_root = "$(GENDIR)/" + root
    cmd = "protoc -I{root} --cpp_out={gen} {files}".format(
        root = root,
        gen = gen_root,
        files = " ".join(rel),
    )
    if rel_grpc:
        cmd += " && protoc -I{root} --grpc_out={gen} --plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) {files}".format(
            root = root,
            gen = gen_root,
            files = " ".join(rel_grpc),
        )
    native.genrule(
        name = name + "_gen",
        srcs = srcs,
        outs = outs,
        cmd = cmd,
        message = "protoc " + name,
    )
    # Messages only (no gRPC dependency, so kernels and tools that read configs stay light) ...
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".pb.cc") and not o.endswith(".grpc.pb.cc")],
        hdrs = [o for o in outs if o.endswith(".pb.h") and not o.endswith(".grpc.pb.h")],
        includes = [import_root] if import_root else ["."],
        deps = deps + ["@sys//:protobuf"],
        **kwargs
    )

    # ... and the service stubs, `<name>_grpc`.
    if grpc_srcs:
        native.cc_library(
            name = name + "_grpc",
            srcs = [o for o in outs if o.endswith(".grpc.pb.cc")],
            hdrs = [o for o in outs if o.endswith(".grpc.pb.h")],
            includes = [import_root] if import_root else ["."],
            deps = [":" + name, "@sys//:grpc"],
            **kwargs
        )
