"""The Claude Desktop bundle's entry point (server/main.py in it): `stallhound serve` with the arguments its manifest
passes, the folders the user chose."""

import sys

from stallhound.cli.main import main

sys.exit(main(["serve", *sys.argv[1:]]))
