#!/usr/bin/env python3
"""The synopsis and example blocks of the folder READMEs, run as written with the real binaries.

Usage (Bazel passes these):
  readme_synopsis_test.py COORDINATOR WORKER SYCTL MOE_LAYER_IO PREPROCESS

Each block is read from the README at test time (the source tree, found through this script's
real path; the test is tagged `external`, so it is never cached and always reads today's READMEs).
A synopsis runs with its placeholders (upper-case words: FILE, DIR, P, ...) replaced by values this
test owns, every optional [--flag] given once; an unknown placeholder fails the test, so a new
flag in a synopsis needs a value here. Every --flag a synopsis names must be in the binary's
--help. tools/readme_check.py maps each block to this test.

  coordinator/README.md  synopsis: run twice (every optional flag but TLS and --noworkers; then
                         the required flags + TLS + --noworkers); its startup line must match the
                         README's `listening` block; GET /v1/jobs/99 must answer the README's JSON
                         error exactly; SIGTERM exits 0 and leaves the --store-backup file.
  deploy/README.md       the deploy block, line by line: every line is run (kubectl client-side:
                         `create secret ... --dry-run=client -o yaml`, `apply -k` as `kubectl
                         kustomize`, the two syctl lines against the coordinator above) or named
                         with the reason it cannot run here (bazel inside a test, docker without
                         an engine, a cluster); an unknown line fails.
  worker/train/README.md both synopses: standalone 2 steps with --export-hf, then --init-from-hf
                         from that export; two ranks over Gloo on a mock-data job.
  worker/model/README.md moe_layer_io's flags are in its --help (moe_layer_io_test runs it).
  tools/README.md        the preprocess block, each line run in a directory holding docs.jsonl
                         (five chapters of the default corpus) and more.txt.
"""

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import readme_check  # noqa: E402

failures = []

# deploy/README.md's first block, one row per kind of line (first match wins; the line's trailing
# `# comment` removed). A line no row matches fails the test: add a row.
#   run            run as written (bash, in a copy of deploy/'s parent; $bin is a bazel-bin layout
#                  of the real binaries)
#   export         VAR=VALUE pairs kept for the next lines (127.0.0.1:50051 -> this coordinator)
#   kustomize      `kubectl apply -k DIR`: `kubectl kustomize DIR` (apply needs an API server)
#   secret         as written + `--dry-run=client -o yaml`
#   pipe-to-apply  `X | kubectl apply -f -`: X runs and must print a manifest
#   syctl          as written against a real coordinator and CPU worker (127.0.0.1:50051 -> its
#                  address; `jobs/7` -> the job the block submitted)
#   not run: WHY   named, not run
DEPLOY_LINES = [
    (r"bazel build ", "not run: bazel inside a Bazel test; $bin holds the same three binaries"),
    (r"bin=\$\(bazel info bazel-bin\)", "not run: bazel inside a Bazel test; bin= a bazel-bin layout"),
    (r"mkdir |cp ", "run"),
    (r"docker ", "not run: no Docker engine here; deploy_test checks the Dockerfile"),
    (r"export ", "export"),
    (r"kubectl apply -k ", "kustomize"),
    (r"kubectl -n \S+ create secret ", "secret"),
    (r"kubectl -n \S+ (get|port-forward) ", "not run: needs a cluster (the syctl lines use a "
     "local coordinator and its token instead)"),
    (r"syctl .*\|\s*kubectl apply -f -$", "pipe-to-apply"),
    (r"syctl ", "syctl"),
]


def check(ok, message):
    print(("ok: " if ok else "FAIL: ") + message, flush=True)
    if not ok:
        failures.append(message)
    return ok


def block(readme, prefix):
    text = open(os.path.join(ROOT, readme)).read()
    for _, info, body in readme_check.blocks(text):
        first = next((l.strip() for l in body if l.strip()), "")
        if info in readme_check.SHELL_TAGS and first.startswith(prefix):
            return body
    sys.exit("FAIL: %s has no block starting %r" % (readme, prefix))


def joined(lines):
    """Lines with backslash continuations joined; a synopsis's indented lines join too."""
    out = []
    for line in lines:
        if out and (out[-1].endswith("\\") or (line.startswith(" ") and line.strip().startswith(
                ("[", "--")))):
            out[-1] = out[-1].rstrip("\\").rstrip() + " " + line.strip()
        else:
            out.append(line.rstrip())
    return out


def help_flags(binary):
    r = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, "%s --help exits 0" % os.path.basename(binary))
    return {f.replace("-", "_") for f in re.findall(r"--([a-z][a-z0-9_-]*)", r.stdout + r.stderr)}


def check_flags(binary, synopsis):
    known = help_flags(binary)
    named = re.findall(r"--([a-z][a-z0-9_-]*)", synopsis)
    missing = [f for f in named if f.replace("-", "_") not in known and
               not (f.startswith("no") and f[2:].replace("-", "_") in known)]
    check(not missing, "%s --help knows every flag of its README synopsis (%d flags)%s" %
          (os.path.basename(binary), len(set(named)), ": missing " + ", ".join(missing)
           if missing else ""))


def instantiate(synopsis, values, drop=()):
    """argv from a synopsis: brackets removed, placeholders replaced by values[flag], flags in
    `drop` left out (with their value)."""
    tokens = synopsis.replace("[", " ").replace("]", " ").split()
    argv, i = [], 1
    while i < len(tokens):
        flag = tokens[i]
        if not flag.startswith("--"):
            sys.exit("FAIL: synopsis token %r is not a flag: %s" % (flag, synopsis))
        value = None
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            value = tokens[i + 1]
            i += 1
        i += 1
        if flag in drop:
            continue
        if value is None:
            argv.append(flag)
            continue
        if re.fullmatch(r"[A-Z][A-Z:_]*", value) or "|" in value:
            if flag not in values:
                sys.exit("FAIL: no value for %s %s: give it one in this test's table" %
                         (flag, value))
            value = values[flag]
        argv += [flag, str(value)]
    return argv


def wait_line(path, pattern, proc, seconds=60):
    end = time.time() + seconds
    while time.time() < end:
        if os.path.exists(path):
            for line in open(path, errors="replace"):
                if re.search(pattern, line):
                    return line.rstrip("\n")
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    return None


def coordinator_runs(coordinator, worker, syctl, tmp):
    syn = joined(block("coordinator/README.md", "switchyard-coordinator --store FILE"))[0]
    print("synopsis: " + syn)
    check_flags(coordinator, syn)
    listening = block("coordinator/README.md", "switchyard-coordinator listening grpc=")[0].strip()
    # The README's line with its ports as patterns; --health-port (given in the first run) adds
    # its address before tls=.
    pattern = "^" + re.sub(r":\d+", r":\\d+", re.escape(listening)) + "$"
    pattern = pattern.replace(r"\ tls=", r"(\ health=127\.0\.0\.1:\d+)?\ tls=")
    error_json = json.loads(block("coordinator/README.md", '{"error": {"code": 404')[0])
    for name in ("token", "worker-token"):
        with open(os.path.join(tmp, name), "w") as f:
            f.write(name + "-readme-synopsis\n")
    os.makedirs(os.path.join(tmp, "ck"), exist_ok=True)
    os.makedirs(os.path.join(tmp, "data"), exist_ok=True)
    # A free gRPC port chosen here, so that --advertise-address can name it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        grpc_port = s.getsockname()[1]
    values = {
        "--store": os.path.join(tmp, "store.db"), "--grpc-port": grpc_port, "--http-port": 0,
        "--token-file": os.path.join(tmp, "token"),
        "--worker-token-file": os.path.join(tmp, "worker-token"),
        "--store-backup": os.path.join(tmp, "backup.db"), "--host": "127.0.0.1",
        "--health-port": 0, "--shutdown-grace": 2, "--checkpoint-root": os.path.join(tmp, "ck"),
        "--data-root": os.path.join(tmp, "data"), "--advertise-address": "127.0.0.1:%d" % grpc_port,
    }
    argv = [coordinator] + instantiate(syn, values, drop=("--tls-cert", "--tls-key",
                                                          "--noworkers"))
    print("run: " + " ".join(argv[1:]))
    out, err = os.path.join(tmp, "coordinator.out"), os.path.join(tmp, "coordinator.err")
    proc = subprocess.Popen(argv, stdout=open(out, "w"), stderr=open(err, "w"))
    procs = [proc]
    try:
        line = wait_line(out, "listening", proc)
        if not check(line is not None and re.match(pattern, line),
                     "startup line %r matches the README's %r" % (line, listening)):
            print(open(err).read()[-2000:])
            return
        grpc = re.search(r"grpc=(\S+)", line).group(1)
        http = re.search(r"http=(\S+)", line).group(1)
        req = urllib.request.Request("http://%s/v1/jobs/99" % http,
                                     headers={"Authorization": "Bearer token-readme-synopsis"})
        try:
            body = urllib.request.urlopen(req, timeout=30).read()
            status = 200
        except urllib.error.HTTPError as e:
            body, status = e.read(), e.code
        got = json.loads(body)
        check(status == 404 and got == error_json,
              "GET /v1/jobs/99 -> %d %s (README: %s)" % (status, got, json.dumps(error_json)))
        # The deploy block's `syctl k8s-workers jobs/N | kubectl apply -f -` starts the job's
        # worker pods in a cluster; here, one CPU worker scoped to that job (--job, as the
        # manifest's pods are) on this coordinator, which runs with --require-job-scoped-workers.
        def start_scoped_worker(job):
            wproc = subprocess.Popen(
                [worker, "--coordinator", grpc, "--token-file", values["--worker-token-file"],
                 "--device", "cpu", "--heartbeat-ms", "200", "--checkpoint-root",
                 values["--checkpoint-root"], "--data-root", values["--data-root"], "--job", job],
                stdout=open(os.path.join(tmp, "worker.out"), "w"),
                stderr=open(os.path.join(tmp, "worker.err"), "w"))
            procs.append(wproc)
            return wproc
        deploy_block(coordinator, worker, syctl, tmp, grpc, values["--token-file"],
                     start_scoped_worker)
        start = time.time()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        check(rc == 0, "SIGTERM: the coordinator exited %d after %.1f s (--shutdown-grace 2)" %
              (rc, time.time() - start))
        check(os.path.getsize(values["--store-backup"]) > 0,
              "--store-backup %s written" % values["--store-backup"])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    # Second run: the required flags, TLS and --noworkers.
    cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                        "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1"],
                       capture_output=True, text=True)
    if not check(r.returncode == 0, "openssl made a test certificate"):
        return
    values.update({"--tls-cert": cert, "--tls-key": key, "--grpc-port": 0,
                   "--store": os.path.join(tmp, "store2.db")})
    optional = ("--store-backup", "--store-backup-interval", "--host", "--health-port",
                "--shutdown-grace", "--checkpoint-root", "--data-root", "--advertise-address")
    argv = [coordinator] + instantiate(syn, values, drop=optional) + ["--host", "127.0.0.1"]
    print("run: " + " ".join(argv[1:]))
    out2 = os.path.join(tmp, "coordinator2.out")
    proc = subprocess.Popen(argv, stdout=open(out2, "w"),
                            stderr=open(os.path.join(tmp, "coordinator2.err"), "w"))
    try:
        line = wait_line(out2, "listening", proc)
        check(line is not None and "tls=true" in line,
              "with --tls-cert/--tls-key and --noworkers: %r" % line)
        proc.send_signal(signal.SIGTERM)
        check(proc.wait(timeout=60) == 0, "SIGTERM: exit 0")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def deploy_block(coordinator, worker, syctl, tmp, grpc, token_file, start_scoped_worker):
    """deploy/README.md's first block, line by line, in a copy of deploy/."""
    work = os.path.join(tmp, "deploy-work")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "deploy"), os.path.join(work, "deploy"), symlinks=True)
    shutil.rmtree(os.path.join(work, "deploy", "docker", "bin"), ignore_errors=True)
    shutil.copy(token_file, os.path.join(work, "token"))
    with open(os.path.join(work, "job.yaml"), "w") as f:
        f.write("display_name: deploy-readme\n"
                "model: {num_layers: 2, hidden_size: 32, num_attention_heads: 2, seq_length: 16,\n"
                "        vocab_size: 64, ffn_hidden_size: 64, num_experts: 4, moe_router_topk: 2}\n"
                "training: {micro_batch_size: 2, global_batch_size: 4, train_iters: 5}\n"
                "data: {mock_data: true}\n")
    # bazel-bin's layout: coordinator/, worker/, cli/ (the runfiles tree has the same).
    binroot = os.path.join(tmp, "bazel-bin")
    for sub, exe in (("coordinator", coordinator), ("worker", worker), ("cli", syctl)):
        os.makedirs(os.path.join(binroot, sub), exist_ok=True)
        dst = os.path.join(binroot, sub, os.path.basename(exe))
        if not os.path.exists(dst):
            os.symlink(exe, dst)
    env = dict(os.environ, bin=binroot, PATH=os.path.dirname(syctl) + ":" + os.environ["PATH"])
    env.pop("KUBECONFIG", None)
    env["HOME"] = tmp  # kubectl: no kubeconfig, nothing cached in the real home

    def sh(cmd):
        return subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], cwd=work, env=env,
                              capture_output=True, text=True, timeout=300)

    state = {"job": None}  # the job the block's `syctl submit` created: its `jobs/7` below

    def run(cmd, where):
        r = sh(cmd)
        check(r.returncode == 0, "%s -> exit %d %s" %
              (where, r.returncode, (r.stdout + r.stderr).strip()[-300:]))
        return r

    def action(kind, cmd, where):
        if kind == "run":
            run(cmd, where)
        elif kind == "export":  # kept for the lines after it, the address made this coordinator's
            for name, value in re.findall(r"(\w+)=(\S+)", cmd[len("export "):]):
                env[name] = value.replace("127.0.0.1:50051", grpc)
            print("ok: %s (set for the next lines, address %s)" % (where, grpc))
        elif kind == "kustomize":  # `kubectl apply -k DIR`: its client side (apply needs an API)
            directory = cmd.split()[-1]
            r = sh("kubectl kustomize " + directory)
            kinds = sorted(set(re.findall(r"^kind: (\S+)", r.stdout, re.M)))
            check(r.returncode == 0 and "Namespace" in kinds and "namespace: switchyard" in
                  r.stdout, "%s -> client side: kubectl kustomize %s renders %s %s" %
                  (where, directory, kinds, r.stderr[-300:]))
        elif kind == "secret":
            r = sh(cmd + " --dry-run=client -o yaml")
            token = re.search(r"^  token: (\S+)", r.stdout, re.M)
            value = base64.b64decode(token.group(1)).decode() if token else ""
            check(r.returncode == 0 and "kind: Secret" in r.stdout and
                  re.fullmatch(r"[0-9a-f]{64}", value) is not None,
                  "%s --dry-run=client -o yaml -> a Secret with a 64-hex token %s" %
                  (where, r.stderr[-300:]))
        elif kind == "pipe-to-apply":  # `X | kubectl apply -f -`: X runs, the apply needs an API
            left = cmd[:cmd.rindex("|")].strip()
            if state["job"]:
                left = left.replace("jobs/7", state["job"])
            r = sh(left)
            check(r.returncode == 0 and re.search(r"^kind: ", r.stdout, re.M) is not None,
                  "%s -> %s prints a manifest (kubectl apply not run: needs a cluster) %s" %
                  (where, left[:60], r.stderr[-300:]))
            if state["job"]:
                check(re.search(r"--job[= ]%s\b" % re.escape(state["job"]), r.stdout) is not None,
                      "%s: the manifest's workers are scoped to %s" % (where, state["job"]))
                start_scoped_worker(state["job"])
                print("ok: %s: started a CPU worker with --job %s (what the applied pods run)" %
                      (where, state["job"]))
        elif kind == "syctl":  # against this test's coordinator and CPU worker
            real = cmd.replace("127.0.0.1:50051", grpc)
            if state["job"]:
                real = real.replace("jobs/7", state["job"])
            r = run(real, where + " (coordinator %s)" % grpc)
            if re.search(r"\bsubmit\b", cmd):
                m = re.search(r"jobs/\d+", r.stdout + r.stderr)
                state["job"] = m.group(0) if m else None
                if "--wait" in cmd:
                    check("SUCCEEDED" in r.stdout + r.stderr, where + ": the job SUCCEEDED")
            if cmd.endswith(" workers"):
                check(re.search(r"\bcpu\s+IDLE\b", r.stdout) is not None,
                      where + ": lists this test's CPU worker")
        elif kind.startswith("not run"):
            print("ok: %s (%s)" % (where, kind))
        else:
            sys.exit("FAIL: DEPLOY_LINES kind %r" % kind)

    lines = joined(block("deploy/README.md", "# 1. binaries"))
    for line in lines:
        cmd = re.split(r"\s+#\s", line)[0].strip() if not line.strip().startswith("#") else ""
        if not cmd:
            continue
        where = "deploy: " + cmd[:90]
        kinds = [k for pattern, k in DEPLOY_LINES if re.match(pattern, cmd)]
        if not kinds:
            check(False, "%s: no DEPLOY_LINES row of tools/readme_synopsis_test.py says how to run "
                  "it: add one" % where)
            continue
        action(kinds[0], cmd, where)
        if cmd.startswith("bazel build "):
            check(set(cmd.split()[2:]) == {"//coordinator:switchyard-coordinator",
                                           "//worker:switchyard-worker", "//cli:syctl"},
                  where + ": its targets are this test's binaries")
    for exe in ("switchyard-coordinator", "switchyard-worker", "syctl"):
        check(os.path.exists(os.path.join(work, "deploy", "docker", "bin", exe)),
              "deploy/docker/bin/%s copied by the block's cp" % exe)


def worker_runs(worker, tmp):
    train = joined(block("worker/train/README.md", "switchyard-worker --standalone"))
    syn = train[0]
    print("synopsis: " + syn)
    check_flags(worker, syn)
    example = os.path.join(ROOT, "examples", "quickstart.yaml")
    env = dict(os.environ)
    home = os.path.expanduser("~" + os.environ.get("USER", "root"))
    env.setdefault("SWITCHYARD_DATA_DIR", os.path.join(home, ".cache", "switchyard", "data"))
    runs = []
    for name, values in (("export", {"--device": "cpu", "--steps": 2, "--peak-tflops": 989.4,
                                     "--export-hf": os.path.join(tmp, "hf")}),
                         ("import", {"--device": "cpu", "--steps": 2, "--peak-tflops": 989.4,
                                     "--init-from-hf": os.path.join(tmp, "hf")})):
        work = os.path.join(tmp, "standalone-" + name)
        os.makedirs(os.path.join(work, "examples"), exist_ok=True)
        shutil.copy(example, os.path.join(work, "examples", "quickstart.yaml"))
        drop = ("--init-from-hf",) if name == "export" else ("--export-hf",)
        argv = [worker] + instantiate(syn, values, drop=drop)
        r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        check(r.returncode == 0, "%s -> exit %d %s" % (" ".join(argv[1:]), r.returncode,
                                                      (r.stdout + r.stderr)[-400:]))
        runs.append(r)
    check(os.path.exists(os.path.join(tmp, "hf", "config.json")),
          "--export-hf wrote hf/config.json; --init-from-hf read it back")

    ranks = joined(block("worker/train/README.md", "# one command per rank"))
    syn = next(l for l in ranks if l.startswith("switchyard-worker"))
    print("synopsis: " + syn)
    check_flags(worker, syn)
    job = os.path.join(tmp, "ranks", "job.yaml")  # the synopsis's --config job.yaml, in the cwd
    os.makedirs(os.path.dirname(job), exist_ok=True)
    with open(job, "w") as f:
        f.write("model: {num_layers: 2, hidden_size: 32, num_attention_heads: 2, seq_length: 16,\n"
                "        vocab_size: 64, ffn_hidden_size: 64, num_experts: 4, moe_router_topk: 2}\n"
                "parallel: {expert_model_parallel_size: 2}\n"
                "training: {micro_batch_size: 2, global_batch_size: 4, train_iters: 3}\n"
                "data: {mock_data: true}\n")
    rdv = tempfile.mkdtemp(dir=tmp, prefix="rendezvous-")
    procs = []
    for rank in range(2):
        values = {"--rank": rank, "--world-size": 2, "--rendezvous": rdv, "--config": job,
                  "--device": "cpu", "--steps": 2, "--comm-timeout": 60,
                  "--gloo-host": "127.0.0.1"}
        argv = [worker] + instantiate(syn, values)
        procs.append(subprocess.Popen(argv, cwd=os.path.dirname(job), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    print("run (x2): " + " ".join(argv[1:]))
    for rank, p in enumerate(procs):
        out, _ = p.communicate(timeout=600)
        check(p.returncode == 0, "rank %d of 2 (EP 2, Gloo) -> exit %d %s" %
              (rank, p.returncode, out[-300:] if p.returncode else ""))


def preprocess_runs(preprocess, tmp):
    lines = joined(block("tools/README.md", "mkdir -p out"))
    work = os.path.join(tmp, "preprocess")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    home = os.path.expanduser("~" + os.environ.get("USER", "root"))
    data = os.environ.get("SWITCHYARD_DATA_DIR", os.path.join(home, ".cache", "switchyard", "data"))
    with open(os.path.join(data, "kjv", "kjv.jsonl")) as src, \
            open(os.path.join(work, "docs.jsonl"), "w") as dst:
        for _ in range(5):
            dst.write(src.readline())
    with open(os.path.join(work, "more.txt"), "w") as f:
        f.write("In the beginning God created the heaven and the earth.\n")
    env = dict(os.environ, PATH=os.path.dirname(preprocess) + ":" + os.environ["PATH"])
    for line in lines:
        cmd = line.split(" #")[0].strip()
        if not cmd or cmd.startswith("#"):
            continue
        if cmd.startswith("preprocess "):
            check_flags(preprocess, cmd)
        r = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True, text=True,
                           timeout=300)
        check(r.returncode == 0, "tools: %s -> exit %d %s" %
              (cmd, r.returncode, (r.stdout + r.stderr).strip()[-300:]))
    for f in ("docs.bin", "docs.idx", "tokenizer.json", "more.bin", "more.idx"):
        check(os.path.getsize(os.path.join(work, "out", f)) > 0 if os.path.exists(
            os.path.join(work, "out", f)) else False, "tools: out/%s written" % f)


def main():
    coordinator, worker, syctl, moe_layer_io, preprocess = (
        os.path.realpath(a) for a in sys.argv[1:6])
    tmp = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
    print("READMEs from %s" % ROOT)
    moe = joined(block("worker/model/README.md", "moe_layer_io --config"))[0]
    print("synopsis: " + moe)
    check_flags(moe_layer_io, moe)
    preprocess_runs(preprocess, tmp)
    coordinator_runs(coordinator, worker, syctl, tmp)
    worker_runs(worker, tmp)
    if failures:
        print("FAILED: %d check(s)" % len(failures))
        return 1
    print("PASS: the coordinator, deploy, worker/train, worker/model and tools README blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
