"""Building blocks shared by the model families (DESIGN.md §1). Each is usable on its own."""
