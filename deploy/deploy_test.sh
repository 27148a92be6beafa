#!/usr/bin/env bash
# //deploy:deploy_test: runs deploy_test.py (python3 + PyYAML, installed by tools/setup.sh) from
# the runfiles tree. Args: the switchyard-coordinator and switchyard-worker binaries.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec python3 "$here/deploy_test.py" "$@"
