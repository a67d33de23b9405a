"""inferops.numa: read the NUMA topology, plan placement, apply and audit it.

The same package runs inside Ansible modules (AnsiballZ) and, copied to a target
as a plain package named ``numa``, as the ``numa-pin`` helper. Its modules import
each other relatively and use the standard library only. cli.py and cli_cost.py are
numa-pin's edge: no other module imports them, so no Ansible module ships them.
"""
