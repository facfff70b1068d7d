"""The run's configuration: the typed schema, its settings and ranges, and what `auto` picks."""
