"""The command layer: one module per `vepo-trl` command (`train`, `demo`, `eval`, `strategies`, `inspect`, `analyze`,
`plot`, `lab`), each with `main(argv)`, in the manner of `trl/cli/commands/`.

Every module declares its command's options once, as a dataclass of `options.option` fields (help text, value rule,
group), and checks what needs no model before anything heavy is imported: the parser is read from the declaration
(`options.parser_for`: a repeated flag refused, every value through its field's rule), and `train` and `demo` go
through TRL's parser over `VEPOConfig` and the script's dataclasses after the same checks on the raw command line and
recipe (`validation.RANGES`). The work they then start lives below (`train`, `eval.run`, `insight`, `lab`).
`cli.py` keeps the table of commands and the one door every user error, interruption and fault goes out of.
"""
