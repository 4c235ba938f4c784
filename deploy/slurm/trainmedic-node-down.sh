#!/bin/sh
# strigger program: Slurm runs it with the node list as $1 when nodes go DOWN.
# Registered with:
#   strigger --set --node --down --program=/opt/trainmedic/libexec/trainmedic-node-down.sh --flags=PERM
TRAINMEDIC_BIN="${TRAINMEDIC_BIN:-/opt/trainmedic/bin/trainmedic}"
export TRAINMEDIC_STATE_DIR="${TRAINMEDIC_STATE_DIR:-/var/lib/trainmedic}"
timeout 3 "$TRAINMEDIC_BIN" report --node-down --nodes "$1" >/dev/null 2>&1
exit 0
