#!/bin/sh
# trainmedic epilog: tell the controller how the job ended. Install as EpilogSlurmctld
# (recommended: runs on the controller host, has SLURM_JOB_EXIT_CODE2) or as Epilog
# (slurmd, each compute node: then TRAINMEDIC_STATE_DIR must be on storage the
# controller reads). It never fails and never takes more than ~2 s: a failing slurmd
# Epilog would drain the node.
#
# Slurm gives epilogs no PATH: set it, or point TRAINMEDIC_BIN at the executable.
TRAINMEDIC_BIN="${TRAINMEDIC_BIN:-/opt/trainmedic/bin/trainmedic}"
export TRAINMEDIC_STATE_DIR="${TRAINMEDIC_STATE_DIR:-/var/lib/trainmedic}"

# Only failed jobs matter; with the exit status at hand skip the successful ones here.
# (Without it - slurmd Epilog - the controller asks Slurm.)
case "${SLURM_JOB_EXIT_CODE2:-}" in
  0:0) exit 0 ;;
esac

if [ -x "$TRAINMEDIC_BIN" ]; then
  timeout 3 "$TRAINMEDIC_BIN" report >/dev/null 2>&1
fi
exit 0
