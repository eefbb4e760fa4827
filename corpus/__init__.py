"""The corpus of real profiles triage is judged on (developer tooling, never imported by src/stallhound).

sources.py reads corpus/sources/*.toml and finds each profile's file; expect.py reads corpus/expect/*.toml and
checks a triage against it; invariants.py holds what every triage must satisfy; triaged.py runs triage on one file;
restore.py, manifest.py and review.py are the `make corpus-restore`, `corpus-manifest` and `corpus-review` commands.
"""
