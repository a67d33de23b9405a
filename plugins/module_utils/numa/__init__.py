"""inferops.numa: read the NUMA topology, plan placement, apply and audit it.

The same package runs inside Ansible modules (AnsiballZ) and, copied to a target
as a plain package named ``numa``, as the ``numa-pin`` helper. Its modules import
each other relatively and use the standard library only. One subpackage per layer
(docs/architecture.md): base, inputs, decide, system, read, act, watch, then cli,
numa-pin's edge, which no other layer imports, so no Ansible module ships it.
"""
