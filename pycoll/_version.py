"""The package version, in a leaf module: whatever needs it (the flight recorder's dumps, the
bench reports) imports it from here, not from the package root."""
__version__ = "0.1.0"
