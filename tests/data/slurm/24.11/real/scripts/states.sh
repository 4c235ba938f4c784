export SLURM_CONF=/tmp/lab/etc/slurm.conf
cd /tmp/lab/jobs
python -m trainmedic.cli.main lab revive-node gpu02 --root /tmp/lab >/dev/null 2>&1
j=$(sbatch --parsable -J fail3 -N1 --wrap 'exit 3'); sleep 3
echo default: $(squeue --json | python3 -c "import json,sys; print([(j['job_id'],j['job_state']) for j in json.load(sys.stdin)['jobs']])")
echo states_all: $(squeue --json --states=all | python3 -c "import json,sys; print([(j['job_id'],j['job_state']) for j in json.load(sys.stdin)['jobs']])")
echo -t all: $(squeue --json -t all | python3 -c "import json,sys; print([(j['job_id'],j['job_state']) for j in json.load(sys.stdin)['jobs']])")
squeue --json --states=all > /opt/cap/out/finished_squeue_states_all.json
squeue --json > /opt/cap/out/finished_squeue_default.json
squeue --states=all -h -o '%i %T'
