"""monitor stage."""
