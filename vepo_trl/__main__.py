"""`python -m vepo_trl ...` is the `vepo-trl` command."""

from .cli import main


main()
