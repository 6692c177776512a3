"""A run: the run session (runner), planning, the stage executor, the engine pool, publishing,
stopping, clusters brought up for a run, and the watch session."""
