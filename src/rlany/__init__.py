"""rlany: RLAnything as composable command-line stages.

Importing this package is cheap on purpose: it imports neither torch nor vllm.
Heavy imports live inside the functions that need them.
"""

__version__ = "0.1.0"
