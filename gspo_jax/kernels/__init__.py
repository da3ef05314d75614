"""Attention kernels below the model: the continuous rollout engine's paged KV cache and the
attention over its pages (paged_attention.py, plain JAX), and that attention as Pallas kernels
(paged_kernel.py for a TPU, paged_kernel_gpu.py for a GPU). The model's attention layer calls
paged_attention.attend_pages when its cache is paged; the engine (rollout/continuous.py) owns the
pages."""
