"""Data: the ``Batch`` container, parquet datasets in verl's schema, prompt rendering."""
