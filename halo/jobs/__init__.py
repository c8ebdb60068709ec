"""`halo job`: detached training jobs with a lifecycle, in Docker on this host or under Slurm."""
