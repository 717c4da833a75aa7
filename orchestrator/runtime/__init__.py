"""The runtime: carries out what the core decides (bus, executor, driver actors, repository, workspaces)."""
