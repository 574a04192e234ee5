#!/bin/sh
# What the SQL functions need on every PostgreSQL server installed from Debian's packages
# (postgresql-<major>), made where it is missing:
#   * PL/Python (plpython3u): the package postgresql-plpython3-<major>;
#   * the library topk_server (frontends/sql/server: refusals without CONTEXT lines, the calls'
#     reads kept out of the caller's EXPLAIN), built with the server's PGXS (the package postgresql-server-dev-<major>) and installed into its lib
#     directory, with the SHA-256 of its source beside it so that a changed source is rebuilt.
# Idempotent and quiet when everything is in place; called by `make test` and by
# `make server-side`. Needs root (or password-less sudo) only when something is missing.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
source_dir="$here/frontends/sql/server"
source_sum=$(sha256sum "$source_dir/topk_server.c" | cut -d' ' -f1)

if [ "$(id -u)" -eq 0 ]; then
    run=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    run="sudo -n"
else
    run="none"
fi

packages=""
rebuild=""
for dir in /usr/lib/postgresql/*/; do
    [ -x "${dir}bin/postgres" ] || continue
    major=$(basename "$dir")
    [ -e "${dir}lib/plpython3.so" ] || packages="$packages postgresql-plpython3-$major"
    if [ "$(cat "${dir}lib/topk_server.sha256" 2>/dev/null)" != "$source_sum" ]; then
        rebuild="$rebuild $major"
        [ -e "/usr/include/postgresql/$major/server/postgres.h" ] \
            || packages="$packages postgresql-server-dev-$major"
    fi
done
[ -z "$packages$rebuild" ] && exit 0

if [ "$run" = "none" ]; then
    echo "ensure-server-side: missing for the PostgreSQL server(s):$packages (topk_server for:" \
        "$rebuild); run as root: make server-side" >&2
    exit 1
fi
if [ -n "$packages" ]; then
    echo "ensure-server-side: installing$packages"
    export DEBIAN_FRONTEND=noninteractive
    if ! $run apt-get install -y -q --no-install-recommends $packages >/dev/null; then
        $run apt-get update -q >/dev/null
        $run apt-get install -y -q --no-install-recommends $packages >/dev/null
    fi
fi
for major in $rebuild; do
    echo "ensure-server-side: building topk_server for PostgreSQL $major"
    build=$(mktemp -d)
    cp "$source_dir/topk_server.c" "$source_dir/Makefile" "$build/"
    # with_llvm=no: no JIT bitcode (the function is one call, never worth compiling)
    make -s -C "$build" PG_CONFIG="/usr/lib/postgresql/$major/bin/pg_config" with_llvm=no \
        >/dev/null
    $run make -s -C "$build" PG_CONFIG="/usr/lib/postgresql/$major/bin/pg_config" with_llvm=no \
        install >/dev/null
    echo "$source_sum" | $run tee "/usr/lib/postgresql/$major/lib/topk_server.sha256" >/dev/null
    rm -rf "$build"
done
