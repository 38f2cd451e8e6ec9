"""Runs the migration tool: ``python -m tfring.migrate --help``."""
import sys

from tfring.migrate.cli import main

sys.exit(main())
