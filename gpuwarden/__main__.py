from gpuwarden.cli.main import main

main()
