"""The stages: one module per `rlany` command, named after it, each read top to bottom
(options class, the pure logic, the file driver `run`)."""
