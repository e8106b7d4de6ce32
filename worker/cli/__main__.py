"""`python -m worker.cli`: the `backfill` command."""

from worker.cli.main import main

raise SystemExit(main())
