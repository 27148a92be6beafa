#!/usr/bin/env bash
# Command-line contract of syctl (see cli/syctl.cc).
set -u
bin="$1"
err="$TEST_TMPDIR/err"
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect <exit code> <stdout regex> <stderr regex> -- args...
expect() {
  local want_rc=$1 want_out=$2 want_err=$3
  shift 4
  local out rc
  out=$("$bin" "$@" 2>"$err"); rc=$?
  [[ $rc -eq $want_rc ]] || fail "syctl $*: exit $rc, want $want_rc"
  grep -Eq -- "$want_out" <<<"$out" || fail "syctl $*: stdout '$out' !~ /$want_out/"
  if [[ $want_err == '^$' ]]; then
    [[ ! -s $err ]] || fail "syctl $*: unexpected stderr '$(cat "$err")'"
  else
    grep -Eq -- "$want_err" "$err" || fail "syctl $*: stderr '$(cat "$err")' !~ /$want_err/"
  fi
  echo "ok: syctl $*"
}

expect 0 '^syctl 0\.1\.0$' '^$' -- version
expect 0 '^\{"version":"0\.1\.0"\}$' '^$' -- -o json version
expect 0 '^\{"version":"0\.1\.0"\}$' '^$' -- version -o json
expect 0 '^\{"version":"0\.1\.0"\}$' '^$' -- --output=json version
expect 0 '^syctl 0\.1\.0$' '^$' -- -o text version
expect 0 'quickstart' '^$' -- help
expect 0 'submit' '^$' -- --help
expect 2 '^$' 'missing verb' --
expect 2 '^$' "unknown verb 'frobnicate'" -- frobnicate
expect 2 '^$' "unknown output format 'yaml'" -- -o yaml version
expect 2 '^$' "unknown flag '--bogus'" -- --bogus version
expect 2 '^$' 'version takes no arguments' -- version extra
for verb in plan submit get list cancel watch workers quickstart; do
  expect 2 '^$' "^syctl $verb: not available yet in this build$" -- "$verb"
done
echo "syctl command line OK"
