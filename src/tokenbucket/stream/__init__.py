"""stream stage."""
