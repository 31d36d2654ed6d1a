"""Domain facts, each declared once as data (``vigil/knowledge/data``) with a typed loader.

- ``metrics``: every DCGM_* / vigil_* metric name: family, Prometheus type, unit, help;
- ``xid``: THE Xid table (NVIDIA's catalogue: mnemonic, bucket, level, action) with the fault each code means;
- ``faults``: THE fault catalogue: target entity kinds, fault level, symptoms, remedies, trace weight, and
  the detector findings that are symptoms rather than causes;
- ``actions``: the remediation whitelist with the only command each action may carry.

Loaders import only the vocabulary (``vigil.model``) and ``vigil.config``; every stage reads these tables
instead of keeping its own copy.
"""
