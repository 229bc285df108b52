"""`rlany loop`, above the stages it drives: the run (loop.py, the walk) and what it runs
with, its executors (in process, launched, printed plan), config, stage tables, resume
checks, the plan's shards, launched training, metrics and the evaluations and warm starts
shared by the runs of one runs directory. Every module with its summary: docs/modules.md
(generated from the tree: `make docs`).
"""
