from .verify import main

main()
