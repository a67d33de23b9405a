"""inferops.numa: read the NUMA topology, plan placement, apply and audit it.

The same package runs inside Ansible modules (AnsiballZ) and, copied to a target
as a plain package named ``numa``, as the ``numa-pin`` helper. Its modules import
each other relatively and use the standard library only.
"""
