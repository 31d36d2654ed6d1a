"""The real one-node Slurm cluster's fixtures, for the tiers acting through Slurm."""

from tests.slurm_cluster import on_path as on_path
from tests.slurm_cluster import slurm as slurm
