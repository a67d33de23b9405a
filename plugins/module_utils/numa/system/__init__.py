"""Layer 4: the kernel's calls (affinity, memory policy, move_pages, openat2) and the root-safe file layer."""
