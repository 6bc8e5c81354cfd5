"""Tiers behind the local store: backends the composed cache asks after a local miss."""
