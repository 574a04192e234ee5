#!/bin/sh
# Make PL/Python (plpython3u) available to every PostgreSQL server installed from Debian's packages
# (postgresql-<major>): installs postgresql-plpython3-<major> where it is missing. Idempotent and
# quiet when already installed; called by `make test` (the SQL function's tests need it) and by
# `make plpython`. Needs root (or password-less sudo) only when something is missing.
set -eu

missing=""
for dir in /usr/lib/postgresql/*/; do
    [ -x "${dir}bin/postgres" ] || continue
    major=$(basename "$dir")
    [ -e "${dir}lib/plpython3.so" ] || missing="$missing postgresql-plpython3-$major"
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
    run=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    run="sudo -n"
else
    echo "ensure-plpython: PL/Python is missing; run as root: apt-get install$missing" >&2
    exit 1
fi
echo "ensure-plpython: installing$missing"
export DEBIAN_FRONTEND=noninteractive
if ! $run apt-get install -y -q --no-install-recommends $missing >/dev/null; then
    $run apt-get update -q >/dev/null
    $run apt-get install -y -q --no-install-recommends $missing >/dev/null
fi
