"""The framework's web layer: app factory, JSON envelope, auth, health."""
