"""Recipes: one TOML file describes a whole linking system; `linker recipe run FILE` builds it.

A recipe names its data and every stage of the system; each stage calls the library function that its
CLI command calls, and is cached under ``<out>/stages/<stage>-<key12>/`` by the hash of its settings, of
the content of the files it reads and of the keys of the stages it reads from. A re-run does only what
changed. Only ``[dictionary.NAME]``, ``[index]`` and ``[evaluate]`` are required::

    [recipe]                       # optional: name, description, the starting encoder, the expected figure
    encoder = "minilm"             # minilm, e5-small, a model folder or a hub name
    expect = { acc1 = 73.54, filter = "full", report = "eval/accuracy/..." }

    [datasets]                     # labelled mentions, as `linker eval --dataset` specs or tables
    train = "pubtator:../shared/data/ncbi_disease/NCBItrainset_corpus.txt"
    dev = { format = "pubtator", path = "...", options = { biosyn = true, typos = "..." } }
    test = "..."                   # read once, by [evaluate]; no other stage may name it

    [dictionary.NAME]              # one concept table; sources as `linker dict build`, first wins on duplicates
    sources = [
      { source = "tsv", paths = ["medic.txt"], lang = ["en"] },   # + sab, sty, group, synonyms, current_only, ...
      { mentions = "train", lang = "en", ids = "first" },         # labelled mentions as names of their concept
      { dictionary = "OTHER" },                                   # another [dictionary.OTHER], merged
    ]

    [sap]                          # `linker train sap`: dictionary, encoder, and SapConfig's fields
    [biosyn]                       # `linker train biosyn`: dictionary, encoder (@sap), train, monitor, BiosynConfig
    [biosyn.choose]                # optional: settings chosen on dev (grid / points; epochs = true)
    [rerank]                       # `linker train rerank`: dictionary, encoder, train, mine, mine_preset, rerank_k
    [index]                        # `linker index build`: kind, dictionary, encoder, prior, reranker,
    [index.tfidf]                  #   sparse_weight (hybrid: number, "learned", "tuned" on dev);
    [index.dense]                  #   TfidfConfig / DenseConfig fields (preset = "medical-crossing")
    [calibrate]                    # `linker calibrate` on held-in data: dataset (default "dev"), composite
    [evaluate]                     # `linker eval`: test, train, filters, k, composite, mode, ...

``name`` is an identifier (``[A-Za-z0-9][A-Za-z0-9._-]*``, no ``..``): it names the default output
``out/recipes/NAME``. The output folder may not touch anything the recipe reads (`runner.recipe_inputs`), and a
cached stage is used only when its files match the sha256 its ``stage.json`` recorded. A dictionary may include
ones defined later in the file; includes are walked once each, at most 64 deep, and a cycle is refused.

Paths are relative to the recipe's folder, else the repository, else the working directory. Model
references ``@sap`` and ``@biosyn`` name the models of those stages. Test data is read only by
``[evaluate]``; ``<out>/test_ledger.json`` counts every evaluation of each test set (by content) across
runs, and the model card reports it. See ``recipes/README.md``.
"""

from linker.recipe.cache import Digests, Ledger
from linker.recipe.runner import Plan, RunResult, plan_recipe, run_recipe
from linker.recipe.schema import Recipe, RecipeError, load_recipe

__all__ = ["Digests", "Ledger", "Plan", "Recipe", "RecipeError", "RunResult", "load_recipe", "plan_recipe",
           "run_recipe", "default_out"]


def default_out(recipe: Recipe):
    """Where `linker recipe run` writes without --out: out/recipes/<recipe name> under the working directory."""
    from pathlib import Path

    return Path("out") / "recipes" / recipe.name
