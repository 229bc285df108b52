"""`python -m rlany` (and `accelerate launch -m rlany`). The guard matters: vLLM's spawned
workers re-import the main module, which must not run the CLI again."""

if __name__ == "__main__":
    from rlany.cli import main

    main()
