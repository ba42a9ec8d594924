"""lowp's torchtitan benchmark (issue 39): `config_registry` (the models and recipes),
`recipe_converter` (recipe name -> converted torchtitan config), `run.py` (trains configs
with torchtitan's Trainer, a JSON of per-step metrics), `table.py` (the docs/benchmarks.md
table), `run_train.sh` (the whole benchmark), `assets.py` (offline tokenizer and data).
torchtitan finds the registry as `--module benchmarks.torchtitan` with the repository root on
PYTHONPATH."""
