"""Layer 5: reading a host under a root prefix (sysfs, procfs, systemd's view) into the topology and audits."""
