"""The ``quotastream`` commands: run, replay, what-if, simulate, the live view and the
operator commands (``admin/``), each a thin layer over the engine or the core."""
