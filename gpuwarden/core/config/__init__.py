"""Validated configuration: daemon settings and run specs, loaded from YAML with precise errors."""
