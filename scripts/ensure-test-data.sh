#!/bin/sh
# Data the test suite reads from Debian's packages, installed where it is missing:
#   * wordnet-base (/usr/share/wordnet): the "senses" data set of benchmarks/utility_data.py,
#     a long tail of zeros, which tests/core/test_preview_accuracy.py measures.
# Idempotent and quiet when in place; called by `make test`. Needs root (or password-less sudo)
# only when something is missing.
set -eu

[ -e /usr/share/wordnet/cntlist.rev ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
    run=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    run="sudo -n"
else
    echo "ensure-test-data: the Debian package wordnet-base is missing and installing it needs root" >&2
    exit 1
fi
$run apt-get install -y -q wordnet-base >/dev/null 2>&1 \
    || { $run apt-get update -q >/dev/null && $run apt-get install -y -q wordnet-base >/dev/null; }
