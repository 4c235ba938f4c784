#!/bin/bash
export SLURM_CONF=/tmp/lab/etc/slurm.conf
O=/opt/cap/out; J=/tmp/lab/jobs; cd $J; errs=$O/errors.txt
rec() {
  out=$("$@" 2>/tmp/err); rc=$?
  python3 - "$rc" "$out" "$(cat /tmp/err)" "$@" >> $errs <<'PY'
import json,sys
rc,out,err,*argv=sys.argv[1:]
print(json.dumps({"argv":argv,"rc":int(rc),"stdout":out,"stderr":err}))
PY
}
snap() {
  squeue --json > $O/$1_squeue.json
  sinfo --json > $O/$1_sinfo.json
  scontrol -o show job > $O/$1_scontrol_show_job.txt
  scontrol -o show node > $O/$1_scontrol_show_node.txt
  scontrol --json show job > $O/$1_scontrol_json_show_job.json
  scontrol --json show node > $O/$1_scontrol_json_show_node.json
}
# job 4 is RUNNING with --no-requeue now
squeue -h -o '%i %T %N' > $O/phase3_before.txt
rec scontrol requeue 4
rec scontrol update jobid=3 starttime=now
# gpu02: resume from DOWN+DRAIN, then kill its slurmd -> DOWN+NOT_RESPONDING
scontrol update nodename=gpu02 state=resume
sleep 3
/opt/tm/.venv/bin/python -m trainmedic.cli.main lab kill-node gpu02 --root /tmp/lab > /dev/null 2>&1
for i in $(seq 1 40); do sinfo -h -n gpu02 -o %T | grep -q 'down' && break; sleep 1; done
sleep 1
snap nodedown
scontrol -o show node gpu02 > $O/nodedown_scontrol_show_node_one.txt
scontrol --json show node gpu02 > $O/nodedown_scontrol_json_show_node_one.json
# slurmctld stopped (SIGSTOP: timeouts; then killed: unreachable)
ctld=$(cat /tmp/lab/run/slurmctld.pid)
kill -STOP $ctld
rec scontrol -o show job 1
rec scontrol update nodename=gpu01 state=drain reason=x
kill -CONT $ctld; sleep 1
kill -TERM $ctld; for i in $(seq 1 30); do kill -0 $ctld 2>/dev/null || break; sleep 0.5; done
squeue --json > $O/unreachable_squeue.json; echo "rc=$?" > $O/unreachable_rc.txt
sinfo --json > $O/unreachable_sinfo.json; echo "sinfo rc=$?" >> $O/unreachable_rc.txt
rec squeue --json
rec sinfo --json
rec scontrol --json show job
rec scontrol --json show node
rec scontrol -o show job 1
rec scontrol -o show node gpu01
rec scontrol update nodename=gpu01 state=drain reason=x
rec scontrol requeue 1
rec scancel 1
echo done2
