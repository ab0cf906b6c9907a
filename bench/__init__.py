"""specctl bench: client-side load generation, metrics, reports and plots (no torch)."""
