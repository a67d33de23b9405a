"""Lab guest only: a bytecode cache for modules imported from zip files (Ansible's module payloads).

Python caches no bytecode for zip imports, so every Ansible module run in the TCG guest compiled
ansible.module_utils again: seconds of each run. Loaded at every interpreter start through
inferops-lab-pyc.pth, it only patches zipimport's compile step. Entries are keyed by the source
bytes and checked against them on every hit; a miss or an unwritable cache compiles as before.
The code that runs is unchanged, only where its bytecode comes from.
"""
import marshal
import os
import zipimport

CACHE_DIR = "/var/cache/inferops-lab-pyc"
_compile_source = getattr(zipimport, "_compile_source", None)


def _cached_compile(pathname, source):
    import zlib
    name = os.path.join(CACHE_DIR, "%08x-%d" % (zlib.crc32(source), len(source)))
    try:
        with open(name, "rb") as handle:
            cached_source, code = marshal.loads(handle.read())
        if cached_source == source:
            return code
    except (OSError, ValueError, EOFError, TypeError):
        pass
    code = _compile_source(pathname, source)
    try:
        os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
        tmp = "%s.%d" % (name, os.getpid())
        with open(tmp, "wb") as handle:
            handle.write(marshal.dumps((source, code)))
        os.replace(tmp, name)
    except OSError:
        pass
    return code


if _compile_source is not None:
    zipimport._compile_source = _cached_compile
