"""`python -m nasctl`: the same as the `nasctl` command."""

from .cli import main

main()
