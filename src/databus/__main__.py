"""``python -m databus`` runs the command line."""

from databus.cli import main

main()
