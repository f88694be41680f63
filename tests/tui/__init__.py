"""Dashboard tests: pilot-driven screens, SVG snapshots, chart rendering, backends."""
