"""Named deployments shipped as YAML package data; look one up by name."""
