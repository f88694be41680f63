"""Run reports and comparisons: pure functions over a run's recorded data (`RunData`)."""
