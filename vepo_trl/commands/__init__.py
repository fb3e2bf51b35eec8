"""The command layer: one module per `vepo-trl` command (`train`, `demo`, `eval`, `strategies`, `inspect`, `analyze`,
`plot`, `lab`), each with `main(argv)`, in the manner of `trl/cli/commands/`.

Every module declares its command's options and checks what needs no model before anything heavy is imported: the
commands with their own options parse through `options.OneLineParser` (a repeated flag refused, every value through
`validation.OPTION_RULES`), `train` and `demo` through TRL's parser after the same checks on the raw command line and
recipe (`validation.RANGES`). The work they then start lives below (`train`, `eval.run`, `insight`, `lab`).
`cli.py` keeps the table of commands and the one door every user error, interruption and fault goes out of.
"""
