"""tokens stage."""
