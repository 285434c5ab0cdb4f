"""Console scripts: one module per command, argument parsing and the failure contract only."""
