"""Planning a pod run before it starts: per-device memory and a roofline time from the compiled
programs (planning/memory_plan.py, `main --dry_run`), and the FLOPs / bytes of a program with its
loops'
trips counted (planning/hlo_cost.py)."""
