"""The pure core: statuses, ids, events, instructions and the state machine (no I/O, no event loop)."""
