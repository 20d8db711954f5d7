"""Thin typer commands over the library: one module per command group, each adding its commands to the app of
`linker.cli._app`; `linker.cli.main` imports them all and runs the app. Options and checks that several
commands share: `linker.cli.common`."""
