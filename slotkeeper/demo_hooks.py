"""Apps add demo data for `make run` here (a list of callables taking the command's stdout)."""

hooks: list = []
