"""The RL recipe: build a run from its config (build.py), the supervised warm start
(rl/warmstart.py), the batch record (batch.py), forward-only log-prob passes (rl/logprob_passes.py),
the update (rl/update.py), one step (step.py), the loop (rl/trainer.py) and held-out evaluation
(rl/evaluation.py).

    from gspo_jax.rl import trainer
    summary = trainer.train(config, workdir)
"""
