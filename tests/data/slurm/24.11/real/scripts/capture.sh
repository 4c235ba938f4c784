#!/bin/bash
# Capture real Slurm 24.11 outputs from the lab at /tmp/lab (2 nodes x 2 GPUs).
export SLURM_CONF=/tmp/lab/etc/slurm.conf
O=/opt/cap/out; mkdir -p $O; J=/tmp/lab/jobs; mkdir -p $J; cd $J
errs=$O/errors.txt; : > $errs
rec() { # record argv, rc, stdout, stderr of a command expected to fail
  out=$("$@" 2>/tmp/err); rc=$?
  python3 - "$rc" "$out" "$(cat /tmp/err)" "$@" >> $errs <<'PY'
import json,sys
rc,out,err,*argv=sys.argv[1:]
print(json.dumps({"argv":argv,"rc":int(rc),"stdout":out,"stderr":err}))
PY
}
snap() { # snapshot of everything under name $1
  squeue --json > $O/$1_squeue.json
  sinfo --json > $O/$1_sinfo.json
  scontrol -o show job > $O/$1_scontrol_show_job.txt
  scontrol -o show node > $O/$1_scontrol_show_node.txt
  scontrol --json show job > $O/$1_scontrol_json_show_job.json
  scontrol --json show node > $O/$1_scontrol_json_show_node.json
}
sbatch --version > $O/sbatch_version.txt; scontrol --version > $O/scontrol_version.txt
# 1: exit 3, 2: killed by signal 9 (both single-node, finished)
j1=$(sbatch --parsable -J exit3 -N1 -o $J/exit3-%j.out --wrap 'echo hi; exit 3')
j2=$(sbatch --parsable -J sig9 -N1 --wrap 'kill -9 $$')
sleep 4
# 3: running 2-node job on all GPUs, comment with '=' and spaces, std paths with patterns
j3=$(sbatch --parsable -J train -N2 --ntasks-per-node=1 --gres=gpu:2 --exclusive \
     --comment 'tm run=abc step 12' -o $J/train-%j.out -e $J/train-%j.err --wrap 'sleep 900')
sleep 3
# 4: pending, requeue disabled; 5: array 2 tasks pending
j4=$(sbatch --parsable -J noreq -N1 --no-requeue --wrap 'sleep 30')
j5=$(sbatch --parsable -J arr -N1 --array=0-1 -o $J/arr-%A_%a.out --wrap 'sleep 30')
sleep 2
echo "$j1 $j2 $j3 $j4 $j5" > $O/jobids.txt
# drain gpu02 while job 3 runs (ALLOCATED+DRAIN: draining)
scontrol update nodename=gpu02 state=drain reason='tm: Xid 79 on gpu1'
sleep 2
snap running
scontrol -o show job $j3 > $O/running_scontrol_show_job_one.txt
scontrol --json show job $j3 > $O/running_scontrol_json_show_job_one.json
scontrol -o show node gpu02 > $O/running_scontrol_show_node_one.txt
scontrol --json show node gpu02 > $O/running_scontrol_json_show_node_one.json
# errors with slurmctld up
rec scontrol -o show job 999
rec scontrol -o show job 5_7
rec scontrol --json show job 999
rec scontrol -o show node nope
rec scontrol --json show node nope
rec scontrol requeue 999
rec scontrol requeue $j4
rec scontrol requeue $j1
rec scontrol requeuehold 999
rec scontrol update jobid=999 comment=x
rec scontrol release 999
rec scontrol update jobid=$j3 starttime=now
rec scontrol update jobid=$j1 comment=x
rec scontrol update nodename=nope state=drain reason=x
rec scontrol update nodename=gpu01 state=drain
rec scontrol update nodename=gpu01 state=bogus
rec scancel -v 999
# phase 2: node DOWN by hand (job 3 requeued), gpu01 drained idle after job 3 leaves
t0=$(date +%s.%N)
scontrol update nodename=gpu02 state=down reason='tm: node lost'
sleep 2
scontrol requeuehold $j3 2>> $O/notes.txt
scontrol update jobid=$j3 excnodelist=gpu02 2>> $O/notes.txt
scontrol update nodename=gpu01 state=drain reason='tm: ecc errors'
sleep 3
snap downdrain
scontrol -o show job $j3 > $O/downdrain_scontrol_show_job_one.txt
scontrol --json show job $j3 > $O/downdrain_scontrol_json_show_job_one.json
echo done
