"""What a person sees of a run: the live display and tables, the HTML report, its charts, pictures of
the graph, and the run's timeline."""
