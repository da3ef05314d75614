"""Running on devices and hosts: multi-host start-up and row transfers (distributed.py), agreement
between processes and the watchdog (agreement.py), checkpoints (checkpoint.py), the run folder's
records (rundir.py), metrics writers (metrics.py) and cache-entry locks (filelock.py). The mesh and
the shardings are gspo_jax/sharding.py's. Nothing here knows about RL objectives or rollouts."""
