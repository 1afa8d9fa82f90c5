"""CLI subcommands: each module has add_arguments(name, parser) and main(name, args)."""
