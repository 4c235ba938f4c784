"""trainmedic: keeps distributed GPU training running on Slurm clusters."""

__version__ = "0.1.0"
