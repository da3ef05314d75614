"""Test configuration shared by every test module.

Eight simulated CPU devices are created before JAX is imported so that sharding
tests (data, fsdp, tensor, expert axes) run in-process next to single-device tests;
unsharded computations still run on device 0 only.
"""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tests compare float32 results to 1e-5; keep matmuls in full float32 precision.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
