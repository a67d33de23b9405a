"""``python3 -m numa`` (the installed helper's package) runs the numa-pin CLI."""
from .cli.numa_pin import run

if __name__ == "__main__":
    run()
