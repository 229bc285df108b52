"""The record contract, at the bottom of the package: the records every stage reads and
writes (records), their JSONL files (jsonl), how every output is written (outputs), whether
a stage's inputs come from the same run (provenance), and one writer per output (locks).
These import nothing of rlany but `errors` and the test hook. Module map: docs/modules.md.
"""
