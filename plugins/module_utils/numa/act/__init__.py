"""Layer 6: changing or measuring a host (balancing, replicas, page cache, unit text, the cost measurement)."""
