"""The demo: `scripts/demo` runs the whole loop on a simulated lake and prints what to open next."""
