"""What a release ships beside the wheel and the sdist (`make dist`, `make bundle`): server.json for the MCP registry
and the Claude Desktop bundle, each made from pyproject.toml and the README, where their figures are written once."""
