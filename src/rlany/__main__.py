from rlany.cli import main

main()
