"""The `mlplane` command line: one subcommand group per area."""
