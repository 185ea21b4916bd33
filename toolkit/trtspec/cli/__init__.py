"""Click command-line interface. The only package that imports Click."""
