#!/usr/bin/env python3
"""Every shell command block of every README.md is run by a named test or listed with a reason.

Issue 17: "every command in the README and folder READMEs runs as written (a CI test runs them)".
This checker keeps that true as the READMEs change. It reads every README.md of the source tree
(git ls-files, third_party/ excluded), extracts each fenced block whose info string is empty, sh,
bash, shell or console (```c++, ```yaml, ... are code, not commands), and fails unless each block
matches exactly one row of BLOCKS below, and each row matches a block (a stale row fails too).
A row says how its block is covered:

  test  LABEL    a Bazel test runs the block as written (its script or its BUILD rule must name
                 the README, so that the test reads the block from the README itself);
  ci    SCRIPT   .ci/run runs it as written: SCRIPT is .ci/run, tools/test.sh or a script
                 tools/test.sh names, and names each command of the block (its file name);
  skip  REASON   it cannot run here; REASON starts with one of SKIP_KINDS.

INLINE lists commands written in running text that a test runs or that need a GPU (the bench
commands): each must still appear in its README (whitespace-insensitive), so a reworded command
drops out of this list loudly.

A new block (another helper's, a new README) fails this test until it gets a row here: add one
line to BLOCKS. Run: bazel test //tools:readme_check_test (never cached: it reads the source tree).
"""

import os
import re
import subprocess
import sys

# Block info strings that hold shell commands (or their output).
SHELL_TAGS = {"", "sh", "bash", "shell", "console"}
# Why a block may stay unexecuted.
SKIP_KINDS = ("gpu:", "cluster:", "bazel:", "output:", "docker:")

# (README, the block's first line (a prefix, leading spaces ignored), kind, label/script/reason)
BLOCKS = [
    ("README.md", "tools/quickstart.sh", "ci", "tools/test.sh"),
    ("cli/README.md", "export SYCTL_COORDINATOR=", "test", "//cli:readme_commands_test"),
    ("coordinator/README.md", "switchyard-coordinator --store FILE", "test",
     "//tools:readme_synopsis_test"),
    ("coordinator/README.md", "switchyard-coordinator listening grpc=", "test",
     "//tools:readme_synopsis_test"),
    ("coordinator/README.md", '{"error": {"code": 404', "test", "//tools:readme_synopsis_test"),
    ("deploy/README.md", "# 1. binaries", "test", "//tools:readme_synopsis_test"),
    ("deploy/README.md", "bazel --output_base=", "skip",
     "bazel: a Bazel command cannot run inside a Bazel test; .ci/run's `bazel test //...` runs "
     "//deploy:all"),
    ("tools/README.md", "mkdir -p out", "test", "//tools:readme_synopsis_test"),
    ("tools/README.md", "tools/prepare_corpus.sh", "ci", "tools/setup.sh"),
    ("tools/README.md", "bazel test --jobs=2 //tools:readme_check_test", "skip",
     "bazel: a Bazel command cannot run inside a Bazel test; .ci/run's `bazel test //...` runs "
     "these tests"),
    ("tests/e2e/README.md", "bazel run //tests/e2e:coordinator_load_bench", "skip",
     "bazel: a benchmark run through Bazel (1000 workers, 20 s of load); `bazel build //...` "
     "builds it"),
    ("tests/e2e/README.md", "1000/1000 workers attached", "skip",
     "output: one run's numbers from coordinator_load_bench"),
    ("worker/model/README.md", "moe_layer_io --config job.yaml", "test",
     "//tools:readme_synopsis_test"),
    ("worker/train/README.md", "switchyard-worker --standalone --config examples/quickstart.yaml",
     "test", "//tools:readme_synopsis_test"),
    ("worker/train/README.md", "# one command per rank", "test", "//tools:readme_synopsis_test"),
]

# (README, command text in running prose, kind, label/reason)
INLINE = [
    ("README.md", "switchyard-worker --standalone --config examples/quickstart.yaml", "test",
     "//tools:quickstart_test"),
    ("README.md", "add `--export-hf DIR` for a HuggingFace Qwen3-MoE checkpoint", "test",
     "//tools:quickstart_test"),
    ("README.md", "./quickstart_cluster.sh . quickstart.yaml", "test", "//tools:quickstart_test"),
    ("bench/README.md", ".gpu_bundle/run_gpu_bench.sh\n[moe,attention,train]", "skip",
     "gpu: runs the benchmarks and their PyTorch references on the GPU host"),
    ("bench/README.md", "./run_gpu_bench.sh train", "skip", "gpu: GPU host, in the bundle"),
    ("bench/README.md", "./run_gpu_bench.sh attention", "skip", "gpu: GPU host, in the bundle"),
    ("bench/README.md",
     "python3 torch_train_baseline.py --json torch_train.json && ./bench_train_benchmark "
     "--torch_json torch_train.json", "skip", "gpu: GPU host, in the bundle"),
    ("bench/README.md", "bench_train_benchmark --micro_batch 8 --global_batch 32", "skip",
     "gpu: one H200"),
    ("bench/README.md", "./bench_train_benchmark --world 2 --ep 2", "skip", "gpu: two GPUs"),
]


def norm(text):
    return " ".join(text.split())


def readmes(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others",
                          "--exclude-standard", "README.md", "*/README.md"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("FAIL: git ls-files in %s: %s" % (root, out.stderr.strip()))
    return sorted(p for p in set(out.stdout.split()) if not p.startswith("third_party/")
                  and os.path.exists(os.path.join(root, p)))


def blocks(text):
    """(line number, info string, lines) of each fenced block (``` or ~~~, any indent)."""
    found, fence, start, info, body = [], None, 0, "", []
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)", line)
        if fence is None and m:
            fence, start, info, body = m.group(1), n, m.group(2).lower(), []
        elif fence is not None and line.strip().startswith(fence) and not line.strip(fence[0]).strip():
            found.append((start, info, body))
            fence = None
        elif fence is not None:
            body.append(line)
    if fence is not None:
        found.append((start, info, body))
    return found


def rule_text(root, label):
    """The BUILD stanza of //pkg:name and its srcs' text, or None."""
    m = re.match(r"^//([^:]*):(.+)$", label)
    if not m:
        return None
    build = os.path.join(root, m.group(1), "BUILD")
    if not os.path.exists(build):
        return None
    text = open(build).read()
    at = text.find('name = "%s"' % m.group(2))
    if at < 0:
        return None
    start = text.rfind("\n", 0, text.rfind("(", 0, at)) + 1
    end = text.find("\n)", at)
    stanza = text[start:end if end > 0 else len(text)]
    srcs = ""
    for src in re.findall(r'srcs = \["([^"]+)"\]', stanza):
        path = os.path.join(root, m.group(1), src)
        if os.path.exists(path):
            srcs += open(path).read()
    return stanza, srcs, m.group(1)


def check_cover(root, readme, kind, detail, errors, what):
    if kind == "test":
        rule = rule_text(root, detail)
        if rule is None:
            errors.append("%s: %s names no test rule in its BUILD file" % (what, detail))
            return
        stanza, srcs, pkg = rule
        named = (readme in stanza or readme in srcs or
                 (os.path.dirname(readme) == pkg and '"README.md"' in stanza) or
                 (os.path.dirname(readme) == "" and "//:README.md" in stanza))
        if not named:
            errors.append("%s: %s neither names %s in its BUILD rule nor in its script" %
                          (what, detail, readme))
    elif kind == "ci":
        path = os.path.join(root, detail)
        ci = [os.path.join(root, ".ci/run"), os.path.join(root, "tools/test.sh")]
        if not os.path.exists(path):
            errors.append("%s: %s does not exist" % (what, detail))
        elif path not in ci and not any(
                os.path.exists(c) and os.path.basename(detail) in open(c).read() for c in ci):
            errors.append("%s: neither .ci/run nor tools/test.sh runs %s" % (what, detail))
    elif kind == "skip":
        if not detail.startswith(SKIP_KINDS):
            errors.append("%s: the reason must start with one of %s" % (what, ", ".join(SKIP_KINDS)))
    else:
        errors.append("%s: unknown kind %r" % (what, kind))


def main():
    here = os.path.realpath(__file__)
    root = os.path.dirname(os.path.dirname(here))
    if len(sys.argv) > 1:
        root = sys.argv[1]
    if not os.path.exists(os.path.join(root, "WORKSPACE")):
        sys.exit("FAIL: no WORKSPACE at %s (the source tree is found through this script's real path)"
                 % root)
    errors = []
    used = set()
    total = 0
    print("source tree: %s" % root)
    files = readmes(root)
    if "README.md" not in files or len(files) < 5:
        sys.exit("FAIL: found only %s" % files)
    for readme in files:
        text = open(os.path.join(root, readme)).read()
        for start, info, body in blocks(text):
            if info not in SHELL_TAGS:
                continue
            total += 1
            first = next((l.strip() for l in body if l.strip()), "")
            rows = [i for i, b in enumerate(BLOCKS) if b[0] == readme and first.startswith(b[1])]
            where = "%s:%d (```%s, first line %r)" % (readme, start, info, first[:60])
            if len(rows) != 1:
                errors.append("%s: %s row(s) of BLOCKS in tools/readme_check.py match it; add one "
                              "saying which test runs it or why it cannot run" %
                              (where, len(rows) or "no"))
                continue
            used.add(rows[0])
            _, _, kind, detail = BLOCKS[rows[0]]
            check_cover(root, readme, kind, detail, errors, where)
            if kind == "ci" and os.path.exists(os.path.join(root, detail)):
                # The script itself, or .ci/run (which runs tools/test.sh).
                script = open(os.path.join(root, detail)).read() + open(
                    os.path.join(root, ".ci/run")).read()
                for line in body:
                    cmd = line.split("#")[0].split()
                    if cmd and os.path.basename(cmd[0]) not in script:
                        errors.append("%s: %s does not run %r" % (where, detail, cmd[0]))
            print("ok: %-58s %s %s" % ("%s:%d %s" % (readme, start, first[:34]), kind, detail[:60]))
    for i, (readme, prefix, _, _) in enumerate(BLOCKS):
        if i not in used:
            errors.append("BLOCKS row %d (%s, %r) matches no block: remove or update it" %
                          (i, readme, prefix))
    for readme, command, kind, detail in INLINE:
        where = "%s: inline %r" % (readme, command[:50])
        path = os.path.join(root, readme)
        if not os.path.exists(path) or norm(command) not in norm(open(path).read()):
            errors.append("%s: no longer in the README: update INLINE" % where)
            continue
        check_cover(root, readme, kind, detail, errors, where)
        print("ok: %-58s %s %s" % ("%s inline %s" % (readme, norm(command)[:26]), kind, detail[:60]))
    for e in errors:
        print("FAIL: " + e)
    print("%d README files, %d command blocks, %d inline commands: %s" %
          (len(files), total, len(INLINE), "FAILED" if errors else "all covered"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
