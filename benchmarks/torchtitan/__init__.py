"""lowp's torchtitan benchmark (issue 39): `config_registry` (the models and recipes),
`recipe_converter` (recipe name -> converted torchtitan config), `run.py` (one run, every
recipe, a JSON of per-step metrics), `table.py` (the docs/benchmarks.md table), `run_train.sh`.
torchtitan finds the registry as `--module benchmarks.torchtitan` with the repository root on
PYTHONPATH."""
