"""A stage module with a syntax error on line 4 (the missing colon)."""


def clean(events, ctx)
    return events
