"""Worker for tests/test_sampler.py::test_two_process_generate_checks_every_row (not a test).

    python tests/multihost_generate.py PROCESS_ID PORT {good,bad}

Two processes x 2 simulated CPU devices: prompts and prompt lengths are global arrays whose rows
are spread over both hosts, which is how a multi-host caller outside jit passes them. "bad" puts a
prompt length over Lp on process 1 only: both processes must raise the same ValueError (neither
may go on into the compiled rollout and wait there for the other).
"""

import sys

import jax

pid, port, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from gspo_jax import (  # noqa: E402
    models,
    sampler,
    sharding,  # noqa: E402
)

mesh = sharding.make_mesh({"data": 4})
cfg = models.get_model_config("tiny", vocab_size=16, max_seq_len=32)
graphdef, state = nnx.split(models.Transformer(cfg, rngs=nnx.Rngs(0)))
replicated = NamedSharding(mesh, PartitionSpec())
state = jax.tree.map(
    lambda x: jax.make_array_from_process_local_data(replicated, np.asarray(x)), state
)
rows = NamedSharding(mesh, PartitionSpec("data"))
lengths = np.array([4, 9 if (mode == "bad" and pid == 1) else 2], np.int32)  # Lp = 4
prompts = jax.make_array_from_process_local_data(rows, np.full((2, 4), 3, np.int32))
lengths = jax.make_array_from_process_local_data(rows, lengths)
try:
    with sharding.use_mesh(mesh):
        out = sampler.generate(
            nnx.merge(graphdef, state),
            prompts,
            lengths,
            num_samples=2,
            max_new_tokens=4,
            rng=jax.random.key(0),
            eos_id=1,
        )
    print(f"RESULT ok {out.tokens.shape}", flush=True)
except ValueError as e:
    print(f"RESULT ValueError {e}", flush=True)
