"""Layer 6: measuring a host (the cost measurement, the one HTTP client of its own engine, the A/B gate's verdict)."""
