"""Packaged data: the root-cause book and the veteran question list."""
