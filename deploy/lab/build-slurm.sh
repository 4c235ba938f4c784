#!/usr/bin/env bash
# Builds Slurm VERSION from SchedMD's source tarball into PREFIX, for the lab and for
# pyslurm (PyPI's pyslurm builds only against Slurm 25.11, which no Debian release ships).
#
#   deploy/lab/build-slurm.sh [VERSION] [PREFIX]
#
# VERSION defaults to 25.11.7. The tarball is read from $TRAINMEDIC_VENDOR_DIR (default:
# ../shared/vendor beside the repository). PREFIX defaults to
# <state dir>/slurm/VERSION, the state dir being trainmedic's own ($TRAINMEDIC_STATE_DIR,
# else $XDG_STATE_HOME/trainmedic, else ~/.local/state/trainmedic).
#
# Idempotent: a finished build is marked by PREFIX/.trainmedic-build-complete, written
# last, and is reused as is. A prefix without it is a half-finished build: it is wiped
# and built again. Missing Debian build dependencies are installed as root (without
# starting any service); otherwise the script says what to run.
set -euo pipefail

version=${1:-25.11.7}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
vendor=${TRAINMEDIC_VENDOR_DIR:-$repo/../shared/vendor}
state=${TRAINMEDIC_STATE_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/trainmedic}
prefix=${2:-$state/slurm/$version}
stamp=$prefix/.trainmedic-build-complete
# --enable-multiple-slurmd: the lab runs one `slurmd -N <node>` per emulated node on one
# host (Debian's packages are built that way too); without it slurmd has no -N.
configure_flags=(
  --prefix="$prefix" --sysconfdir="$prefix/etc" --enable-multiple-slurmd
  --disable-dependency-tracking --disable-debug
)
# A stamp from a build with other flags is not reused.
build_id="version=$version flags=${configure_flags[*]}"
jobs=$(nproc 2>/dev/null || echo 2)

say() { printf 'build-slurm: %s\n' "$*" >&2; }

built() { [ -f "$stamp" ] && grep -qxF "$build_id" "$stamp"; }

if built; then
  say "Slurm $version already built in $prefix (reused)"
  echo "$prefix"
  exit 0
fi

tarball=$vendor/slurm-$version.tar.xz
if [ ! -f "$tarball" ]; then
  say "no $tarball (set TRAINMEDIC_VENDOR_DIR to the directory holding slurm-$version.tar.xz)"
  exit 2
fi

# --- build dependencies (Debian) -------------------------------------------------------
# libmunge-dev: auth/munge (without it the build has no usable auth plugin).
# libjson-c-dev: serializer/json, so `squeue --json` / `sinfo --json` work (the CLI
# backend reads them). libyaml-dev is optional; python3-dev is for pyslurm's build.
need_pkgs=(gcc make pkg-config xz-utils libmunge-dev libjson-c-dev python3-dev)
missing=()
for p in "${need_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != "0" ]; then
    say "missing Debian packages: ${missing[*]}"
    say "run as root: apt-get update && apt-get install -y ${missing[*]}"
    exit 2
  fi
  say "installing ${missing[*]}"
  # Keep apt from starting packaged services (same as install-deps.sh).
  policy=/usr/sbin/policy-rc.d
  created_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created_policy=1
  fi
  trap '[ "$created_policy" = 1 ] && rm -f "$policy"' EXIT
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- one builder at a time ----------------------------------------------------------------
mkdir -p "$(dirname "$prefix")"
exec 9>"$prefix.lock"
if ! flock -n 9; then
  say "another build of $prefix is running; waiting for it"
  flock 9
fi
if built; then  # the other builder finished it
  say "Slurm $version already built in $prefix (reused)"
  echo "$prefix"
  exit 0
fi

started=$prefix/.trainmedic-build-started
if [ -e "$prefix" ]; then
  # Only ever wipe a prefix this script filled (or an empty one): never a /usr/local.
  if [ ! -e "$started" ] && [ -n "$(ls -A "$prefix" 2>/dev/null)" ]; then
    say "$prefix exists and was not made by this script; refusing to overwrite it"
    exit 2
  fi
  say "$prefix holds a half-finished or outdated build: wiping it"
  rm -rf "$prefix"
fi
work=$prefix.build
rm -rf "$work"
mkdir -p "$work"

start=$(date +%s)
step() { say "[$(($(date +%s) - start))s] $*"; }

step "unpacking $(basename "$tarball")"
tar -xJf "$tarball" -C "$work" --strip-components=1

cd "$work"
step "configure --prefix=$prefix (log: $work/configure.log)"
if ! ./configure "${configure_flags[@]}" >configure.log 2>&1; then
  tail -n 30 configure.log >&2
  say "configure failed"
  exit 1
fi
if grep -q "^checking for munge installation\.\.\. no" configure.log; then
  say "configure found no munge (libmunge-dev); the build would have no auth plugin"
  exit 1
fi

step "make -j$jobs (log: $work/make.log)"
if ! make -j"$jobs" >make.log 2>&1; then
  tail -n 40 make.log >&2
  say "make failed"
  exit 1
fi
step "make install"
mkdir -p "$prefix"
touch "$started"
if ! make install >install.log 2>&1; then
  tail -n 30 install.log >&2
  say "make install failed"
  exit 1
fi
if [ ! -e "$prefix/lib/slurm/auth_munge.so" ]; then
  say "the build has no auth_munge plugin (is libmunge-dev installed?)"
  exit 1
fi

cd /
rm -rf "$work"
# Written last: its presence means the prefix is complete.
printf '%s\nbuilt=%s\nseconds=%s\n' "$build_id" "$(date -u +%FT%TZ)" \
  "$(($(date +%s) - start))" >"$stamp.tmp"
mv "$stamp.tmp" "$stamp"
step "Slurm $version installed in $prefix"
echo "$prefix"
