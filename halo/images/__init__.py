"""Images: the catalog, input hashes, plans and hermetic builds."""
