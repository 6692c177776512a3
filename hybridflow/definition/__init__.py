"""The pipeline file: safe YAML with line numbers, the model, loading and checks, the DAG, stage code
and SQL stages, and what decides a stage's output (its fingerprint)."""
