"""`python -m procstore` and the `procstore` command."""

from procstore._cli import main

if __name__ == "__main__":
    main()
