"""Thin typer commands over the library: one module per command group, registered in `main`."""
