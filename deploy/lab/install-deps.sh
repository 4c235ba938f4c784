#!/usr/bin/env bash
# Installs the Debian packages the Slurm lab and the tests need, when they are missing.
# As root it installs them; otherwise it says what to run. It never starts the
# distribution's own services (slurm, munge, sshd): the lab and the tests run their own.
set -euo pipefail

# binary:package - the Slurm lab, the SSH-mode tests' own sshd on loopback,
# systemd-analyze for verifying the units in deploy/systemd, and chromium for the test
# that approves in the Temporal UI (Playwright drives Debian's browser: no download).
needs=(
  slurmctld:slurmctld slurmd:slurmd sinfo:slurm-client scontrol:slurm-client
  sbatch:slurm-client munged:munge
  sshd:openssh-server ssh:openssh-client ssh-keygen:openssh-client
  systemd-analyze:systemd
  chromium:chromium
)

missing=()
packages=()
for need in "${needs[@]}"; do
  b=${need%%:*} p=${need#*:}
  if ! command -v "$b" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$b" ]; then
    missing+=("$b")
    [[ " ${packages[*]} " == *" $p "* ]] || packages+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "trainmedic: missing ${missing[*]}; Debian packages needed: ${packages[*]}"
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
echo "trainmedic: installed ${packages[*]}"
