export SLURM_CONF=/tmp/lab/etc/slurm.conf
O=/opt/cap/out; cd /tmp/lab/jobs
python -c "
from pathlib import Path; from trainmedic.lab.lab import Lab
Lab(Path('/tmp/lab')).reset(timeout=60)"
a=$(sbatch --parsable -J trainA -N2 --gres=gpu:1 -o /tmp/lab/jobs/a-%j.out --wrap 'sleep 600'); sleep 3
scontrol requeuehold $a; sleep 1
b=$(sbatch --parsable -J heldB -N1 --hold --wrap 'sleep 5')
c=$(sbatch --parsable -J userheld -N1 --begin=now+1hour --wrap 'sleep 5')
scontrol update nodename=gpu02 state=drain reason='tm: idle drain'
sleep 2
echo "$a $b $c" > $O/held_jobids.txt
squeue --json --states=all > $O/held_squeue.json
sinfo --json > $O/held_sinfo.json
scontrol -o show job > $O/held_scontrol_show_job.txt
scontrol -o show node > $O/held_scontrol_show_node.txt
scontrol --json show job > $O/held_scontrol_json_show_job.json
scontrol --json show node > $O/held_scontrol_json_show_node.json
squeue -h -o '%i %T %r' --states=all; sinfo -N -h -o '%N %T %E'
scancel $a $b $c
