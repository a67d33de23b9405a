"""Layer 1: formats and tables (the kernel's number and list syntax, sizes, engines' recipes, GPU vendors, tokens)."""
