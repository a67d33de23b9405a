"""Layer 2: what is asked (the placement options and the checked Request, a role entry's instances, audit options)."""
