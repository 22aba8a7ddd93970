"""``python -m llmgw``: the same CLI as the ``llmgw`` console script."""

from llmgw.cli import main

raise SystemExit(main())
