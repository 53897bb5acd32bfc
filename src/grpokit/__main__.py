from grpokit.cli import main

main()
