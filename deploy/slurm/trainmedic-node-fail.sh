#!/bin/sh
# strigger program for nodes set FAIL (`scontrol update state=fail`): $1 is the node list.
#   strigger --set --node --fail --program=/opt/trainmedic/libexec/trainmedic-node-fail.sh --flags=PERM
TRAINMEDIC_BIN="${TRAINMEDIC_BIN:-/opt/trainmedic/bin/trainmedic}"
export TRAINMEDIC_STATE_DIR="${TRAINMEDIC_STATE_DIR:-/var/lib/trainmedic}"
timeout 3 "$TRAINMEDIC_BIN" report --node-fail --nodes "$1" >/dev/null 2>&1
exit 0
