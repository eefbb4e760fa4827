"""The picture: `stallhound report` writes one self-contained HTML file per profile (or before/after pair), and the
MCP App view draws show_timeline results; both share report/timeline.js."""
