"""Layer 7: changing a host (persisted kernel knobs, replicas, page cache, resctrl groups, unit text, a rollout)."""
