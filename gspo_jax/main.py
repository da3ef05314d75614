"""Command-line entry point: parse flags, set up (multi-host) JAX, call trainer.train.

    python -m gspo_jax.main --config configs/arith.py --workdir runs/arith
    python -m gspo_jax.main --config configs/arith.py:runlocal --workdir /tmp/arith_local \\
        --config.objective.name=grpo --config.objective.eps_low=0.2

A multi-host run (a TPU pod slice) runs the same command on every host with ``--multihost``:
jax.distributed.initialize() then finds the coordinator from the TPU environment. On CPUs (tests,
a local two-process run) pass the coordinator explicitly:

    python -m gspo_jax.main ... --coordinator_address=127.0.0.1:12345 --num_processes=2 \\
        --process_id=0      # and =1 in a second shell

``--list_configs`` prints every config file with its arguments; ``--print_config`` the config a
command line resolves to (neither needs --workdir). A run prints, first, the features that differ
from the plain default (config/features.py).

Restarting the same command in the same workdir resumes from the latest checkpoint.
``--prepare_only`` builds the dataset and the cached warm start and exits (run it once on one host
before a multi-host run, which loads the cached warm start but does not train it).

The entry point is thin on purpose (docs/design.md convention 3): everything it does is available to
notebooks and tests as ``gspo_jax.rl.trainer.train(config, workdir)``.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from gspo_jax import config as config_lib
from gspo_jax.config import ConfigError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file, optionally with ':key=value,...' arguments."
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (metrics, checkpoints, summary).")
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "Call jax.distributed.initialize() (auto-detected on TPU pods)."
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 for jax.distributed (implies multihost)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes (multihost).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (multihost).")
_PREPARE_ONLY = flags.DEFINE_bool(
    "prepare_only", False, "Only prepare the data and the cached warm start, then exit."
)
_ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    "allow_config_change",
    False,
    "Resume even though the config differs from the checkpoint's in fields that change the "
    "experiment (the changed fields are listed; config.json keeps the earlier versions).",
)
_START_FRESH = flags.DEFINE_bool(
    "start_fresh",
    False,
    "Move the workdir's checkpoint folder aside (never deleted) and start from step 0.",
)
_DRY_RUN = flags.DEFINE_bool(
    "dry_run",
    False,
    "Build the abstract state on config.slice's mesh (simulated CPU devices), compile the rollout "
    "and the update at the real shapes, print the per-device memory plan and exit (code 2 when it "
    "does not fit).",
)
_LIST_CONFIGS = flags.DEFINE_bool(
    "list_configs",
    False,
    "Print every config file of the configs/ folder with its arguments and their defaults, then "
    "exit (needs neither --config nor --workdir).",
)
_PRINT_CONFIG = flags.DEFINE_bool(
    "print_config",
    False,
    "Print the config --config and its overrides resolve to (every field), then exit (needs no "
    "--workdir).",
)
CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def main(argv: list[str]) -> None:
    if not flags.FLAGS["verbosity"].present:
        # orbax logs every checkpoint step at INFO; keep the terminal for the progress bar.
        logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; use --config.x.y=value overrides")
    if _LIST_CONFIGS.value:
        from gspo_jax.config import features

        print(features.list_configs(CONFIGS_DIR), flush=True)
        return
    if _CONFIG.value is None:
        raise app.UsageError("--config is required: --config=configs/arith.py (see --list_configs)")
    if _PRINT_CONFIG.value:
        print(_CONFIG.value, flush=True)
        return
    if _WORKDIR.value is None:
        raise app.UsageError("--workdir is required: the run's folder, e.g. --workdir=runs/arith")
    if _DRY_RUN.value:
        _dry_run(_CONFIG.value)
        return
    if _MULTIHOST.value or _COORDINATOR.value:
        from gspo_jax.runtime import agreement as pod
        from gspo_jax.runtime import distributed

        distributed.init_distributed(
            _COORDINATOR.value,
            _NUM_PROCESSES.value,
            _PROCESS_ID.value,
            timeout_s=pod.timeout_of(_CONFIG.value),
        )
    from gspo_jax.rl import trainer  # after distributed init: importing models may touch devices

    if _PREPARE_ONLY.value:
        from gspo_jax.rl import build

        build.prepare(_CONFIG.value, _WORKDIR.value)
        return
    from gspo_jax.config import features

    if _PROCESS_ID.value in (None, 0):  # what ran, said once on a pod
        print(features.describe(_CONFIG.value), flush=True)
    # a single run, or a population (config.population.seeds: many runs as one program)
    trainer.train(
        _CONFIG.value,
        _WORKDIR.value,
        allow_config_change=_ALLOW_CONFIG_CHANGE.value,
        start_fresh=_START_FRESH.value,
    )
    from gspo_jax.runtime import agreement as pod

    pod.finished()  # a pod run: the others stop watching this process's heartbeat


def _dry_run(config) -> None:
    """The memory plan on simulated CPU devices: the slice's device count must be set before JAX
    starts its backend, so this runs before anything touches a device."""
    import os

    from gspo_jax.planning import memory_plan

    if config.slice is None:
        raise ConfigError("--dry_run needs config.slice (e.g. v5p-8): see configs/qwen3_gsm8k.py")
    import jax

    devices = memory_plan.get_slice(config.slice).devices
    # jax is imported (the config imports it) but no backend has started: both settings still
    # apply. The environment variable JAX_PLATFORMS would not: jax read it at import.
    jax.config.update("jax_platforms", "cpu")
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
    )
    from gspo_jax.config import population as population_cfg
    from gspo_jax.planning import pipeline_plan

    if population_cfg.is_population(config):  # the members' stacked programs
        from gspo_jax.planning import population_plan

        plan = population_plan.plan(config)
        print(population_plan.format_plan(plan), flush=True)
    elif pipeline_plan.is_pipelined(config):  # both device groups, sync vs pipelined step
        plan = pipeline_plan.plan(config)
        print(pipeline_plan.format_plan(plan), flush=True)
    else:
        plan = memory_plan.plan(config)
        print(memory_plan.format_plan(plan), flush=True)
    memory_plan.check_fits(plan)


def _config_spec(argv: list[str]) -> str | None:
    """The value of --config (``path[:arg]``) in argv, if given."""
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            return a.split("=", 1)[1]
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def run() -> None:
    """Console-script entry point (``gspo-train``).

    Exit codes: 0 done; 2 a configuration problem (or a dataset file to fix; on a pod run: also
    configs or workdirs that differ between processes); 1 a run-time stop with one ``error: ...``
    line (an unreadable checkpoint folder, a failed save, a diverged loss, a collapse stop,
    another process of a pod run that died, hung or failed); 128 + the signal after SIGTERM /
    SIGINT saved the current step (143, 130). A pod run's processes exit without waiting for
    threads that wait on a peer.

    A configuration problem prints one ``error: ...`` line and exits with code 2, before any work:
    the config file's arguments are checked here (load_config_file turns get_config's ValueError
    into a ConfigError) before absl parses the flags, and everything else by build.build_run,
    the first thing trainer.train and build.prepare do.
    """
    try:
        spec = _config_spec(sys.argv)
        if spec is not None:
            config_lib.check_override_keys(config_lib.load_config_file(spec), sys.argv)
        app.run(main)
    except ConfigError as e:  # configuration errors: one clear line, no traceback wall
        print(f"error: {e}", file=sys.stderr)
        _exit(2)
    except KeyboardInterrupt:  # Ctrl-C before the RL loop (which handles it itself)
        print(
            "interrupted before the first RL step; nothing was lost (rerun the same command)",
            file=sys.stderr,
        )
        sys.exit(130)
    except Exception as e:
        code = _exit_code(e)
        if code is None:
            _unless_a_peer_is_lost()
            raise
        _exit(code)


def _pod_run() -> bool:
    """Whether jax.distributed is up (without importing JAX for a config error)."""
    jax = sys.modules.get("jax")
    return jax is not None and jax._src.distributed.global_state.client is not None


def _exit(code: int) -> None:
    if _pod_run():
        from gspo_jax.runtime import agreement as pod

        pod.exit_together(code)
    sys.exit(code)


def _unless_a_peer_is_lost() -> None:
    """An unexpected error on a pod run is often a peer's death seen by a collective: give the
    watchdog its time to say so in one line (it exits the process) before the traceback."""
    if _pod_run():
        from gspo_jax.runtime import agreement as pod

        pod.wait_for_peers()


def _exit_code(e: Exception) -> int | None:
    """Prints the one line of a run-time stop the user acts on and returns its exit code; None for
    an unexpected error (its traceback is the useful report then)."""
    from gspo_jax.data import files as data_files
    from gspo_jax.rl import trainer
    from gspo_jax.runtime import agreement as pod
    from gspo_jax.runtime import checkpoint, metrics

    if isinstance(e, data_files.DataFileError):  # a dataset file to fix: nothing ran yet
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    if isinstance(e, trainer.Preempted):
        print(str(e), file=sys.stderr, flush=True)
        return e.exit_code
    if isinstance(
        e,
        checkpoint.CheckpointError | metrics.NonFiniteError | metrics.CollapseError | pod.PeerError,
    ):
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    return None


if __name__ == "__main__":
    run()
