"""Building blocks shared by the model families (docs/architecture.md, Layout). Each is usable on its own."""
