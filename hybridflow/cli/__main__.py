"""`python -m hybridflow.cli`: the same command as the `hybridflow` console script."""

from hybridflow.cli import main

main()
