"""``python -m kem_port.cli``: the ``kem`` command."""

from kem_port.cli import main

raise SystemExit(main())
