"""`rlany loop`, above the stages it drives: the run (loop.py) and what it runs with, its
config, stage tables, resume checks, printed plan, launched training, metrics and the
evaluations and warm starts shared by the runs of one runs directory. Every module with its
summary: docs/modules.md (generated from the tree: `make docs`).
"""
