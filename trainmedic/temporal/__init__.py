"""Everything about reaching Temporal: client construction, search attributes, dev server."""
