#!/usr/bin/env bash
# Command-line contract of switchyard-worker (see worker/main.cc).
set -u
bin="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$bin" --self-check) || fail "--self-check exited $?"
echo "$out"
grep -q '^switchyard-worker 0\.1\.0 ' <<<"$out" || fail "--self-check: no version line"
grep -Eq '^backend: (CUDA, [0-9]+ device\(s\)|CPU only \(.+\))$' <<<"$out" || fail "no backend line"
grep -Eq '^CUDA driver .*, NCCL [0-9]+\.[0-9]+\.[0-9]+$' <<<"$out" || fail "no versions line"
"$bin" --self_check >/dev/null || fail "--self_check spelling rejected"

"$bin" >/dev/null 2>"$TEST_TMPDIR/err"; rc=$?
[[ $rc -eq 2 ]] || fail "no mode: exit $rc, want 2"
grep -q 'usage:' "$TEST_TMPDIR/err" || fail "no mode: usage not on stderr"

"$bin" --self-check extra >/dev/null 2>&1; rc=$?
[[ $rc -eq 2 ]] || fail "positional argument: exit $rc, want 2"
echo "switchyard-worker command line OK"
