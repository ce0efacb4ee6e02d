"""Bundle manifests (one JSON file per local model bundle), shipped as package data."""
