"""`python -m app.cli`: the `tickwheel` command."""

from app.cli.main import main

main()
