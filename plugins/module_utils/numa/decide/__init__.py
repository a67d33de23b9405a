"""Layer 3: the planner, a pure function of (topology, request) to a Plan: no file, no syscall."""
