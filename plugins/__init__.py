"""Built-in plugrl plugins. Each subpackage is registered through the ``plugrl`` entry-point
group exactly like a third-party plugin, and imports its heavy libraries only when chosen."""
