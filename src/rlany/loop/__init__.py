"""`rlany loop`, above the stages it drives: the run (loop.py), its config (config.py), the
stage tables (tables.py), a run directory's resume checks (resume.py), the batches that give
every shard work (batches.py), the printed plan and its shards (plan.py, shards.py), training
under a launcher (launch.py), an iteration's metrics (metrics.py), and the base evaluation
and warm start shared by the runs of one runs directory (eval_reuse.py, warm_reuse.py).
"""
