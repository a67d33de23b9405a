"""Layer 9, the edge: numa-pin's commands, arguments in and exit codes out. Nothing else imports it."""
