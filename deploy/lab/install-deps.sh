#!/usr/bin/env bash
# Installs the Debian packages the Slurm lab needs, when they are missing.
# As root it installs them; otherwise it says what to run. It never starts the
# distribution's own slurm/munge services: the lab runs its own daemons.
set -euo pipefail

packages=(slurmctld slurmd slurm-client munge)
binaries=(slurmctld slurmd sinfo scontrol sbatch munged)

missing=()
for b in "${binaries[@]}"; do
  command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || missing+=("$b")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "Slurm lab: missing ${missing[*]}; Debian packages needed: ${packages[*]}"
if [ "$(id -u)" != "0" ]; then
  echo "Run as root: apt-get update && apt-get install -y ${packages[*]}" >&2
  exit 0  # the lab's own commands fail later with the same advice
fi

# Keep apt from starting the packaged services (their config would not be ours).
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && created_policy=1
fi
trap '[ "$created_policy" = 1 ] && rm -f "$policy"' EXIT

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
echo "Slurm lab: installed ${packages[*]}"
