"""tdbg's CPU graph compiler (filled in by the compiler core)."""
