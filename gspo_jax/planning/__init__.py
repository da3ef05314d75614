"""Planning a pod run before it starts: per-device memory and a roofline time from the compiled
programs (memory_plan.py, `main --dry_run`), and the FLOPs / bytes of a program with its loops'
trips counted (hlo_cost.py)."""
