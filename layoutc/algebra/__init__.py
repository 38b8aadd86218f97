"""The algebra layouts are written in: integer index expressions, index maps, element types."""
