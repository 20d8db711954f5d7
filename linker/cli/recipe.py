"""`linker recipe run|plan`: build a whole system (dictionary, training, index, calibration, evaluation)
from one TOML recipe, each stage cached by the hash of its settings and inputs (`linker.recipe`)."""

from __future__ import annotations

from pathlib import Path

import typer

from linker.cli._app import app

recipe_app = typer.Typer(help="Run a whole system from one recipe file (recipes/*.toml).", no_args_is_help=True)
app.add_typer(recipe_app, name="recipe")


@recipe_app.command("run")
def run_cli(
    recipe: Path = typer.Argument(..., help="Recipe file (TOML), e.g. recipes/ncbi-disease.toml."),
    out: Path = typer.Option(None, "--out", "-o", help="Output folder (default out/recipes/NAME); a re-run resumes there."),
    device: str = typer.Option("auto", "--device", help="Training device: auto (a GPU when present), cpu or cuda."),
    until: str = typer.Option(None, "--until", help="Stop after this stage (dictionary, sap, biosyn, rerank, index, calibrate)."),
    threads: int = typer.Option(None, "--threads", help="torch and tf-idf threads (default: the library's)."),
) -> None:
    """Run every stage not cached in OUT, then write OUT/index, OUT/models, OUT/reports and the model card."""
    from linker.recipe import default_out, load_recipe, run_recipe

    loaded = load_recipe(recipe)
    result = run_recipe(loaded, out or default_out(loaded), device=device, until=until, threads=threads,
                        echo=typer.echo)
    if not result.complete:
        typer.echo(f"stopped after {until}: {len(result.ran)} stage(s) ran, {len(result.cached)} cached")
        return
    card = result.card
    for name, metrics in card["metrics"].items():
        full = next((r for r in metrics["rows"] if r["filter"] == "full" and r["lang"] == "all"), metrics["rows"][0])
        typer.echo(f"{name}: {full['filter']} n={full['n']:,} " + " ".join(f"Acc@{k} {v:.2f}" for k, v in full["acc"].items())
                   + f" (test evaluations into this folder: {card['test_evaluations'][name]})")
    if card.get("expected", {}).get("acc1_got") is not None:
        e = card["expected"]
        typer.echo(f"expected Acc@1 {e['acc1']} ({e['filter']}), got {e['acc1_got']:.2f} ({e['acc1_difference']:+.2f})")
    typer.echo(f"wrote {result.out}: index {result.out / 'index'}, model card {result.out / 'model_card.md'}; "
               f"{len(result.ran)} stage(s) ran, {len(result.cached)} cached")


@recipe_app.command("plan")
def plan_cli(
    recipe: Path = typer.Argument(..., help="Recipe file (TOML)."),
    out: Path = typer.Option(None, "--out", "-o", help="Output folder to compare with (default out/recipes/NAME)."),
) -> None:
    """Print the stages, their cache keys and which are cached, stale or new in OUT; runs nothing."""
    from linker.recipe import Digests, Ledger, default_out, load_recipe, plan_recipe
    from linker.recipe.runner import check_out_inputs

    loaded = load_recipe(recipe)
    folder = out or default_out(loaded)
    check_out_inputs(folder, loaded)  # refused here already, not only when run
    memo = folder / ".digests.json"
    plan = plan_recipe(loaded, folder, digests=Digests(memo if memo.is_file() else None))
    for line in plan.lines(Ledger(folder / "test_ledger.json")):
        typer.echo(line)
