"""Hardware: devices (datasheets) and clusters (nodes, links, what collectives cost)."""
