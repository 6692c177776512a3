"""Stage functions the corpus pipelines point at (never run: validate reads them with ast)."""
