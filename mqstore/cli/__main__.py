from mqstore.cli import main

main()
