"""Layer 8: the metrics snapshot, drift actions and one host's page of the fleet report."""
