"""The RL recipe: build a run from its config (build.py), the supervised warm start
(warmstart.py), the batch record (batch.py), forward-only log-prob passes (logprob_passes.py),
the update (update.py), one step (step.py), the loop (trainer.py) and held-out evaluation
(evaluation.py).

    from gspo_jax.rl import trainer
    summary = trainer.train(config, workdir)
"""
