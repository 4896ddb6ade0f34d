"""Federation (CONTRACT.md v1.1, "Federation"; docs/federation.md): domains that keep their own
registries and still reach each other through a directory of capability summaries."""
