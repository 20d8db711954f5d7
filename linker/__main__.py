from linker.cli.main import main

main()
