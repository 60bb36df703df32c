from tunectl.cli import main

main()
