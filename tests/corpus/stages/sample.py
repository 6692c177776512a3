"""Stage functions with the signatures the corpus cases need. validate reads them with ast only."""


def clean(events, ctx):
    """Takes one input and the context."""
    return {"clean_events": events}


def weekly(clean_events, min_events):
    """Takes one input and one param."""
    return clean_events


def report(weekly, ctx=None):
    """Takes one input; ctx is optional."""
    return None


def needs_threshold(events, threshold):
    """`threshold` is required; a case supplies no value for it."""
    return events


def passthrough(**kwargs):
    """Takes anything by name."""
    return kwargs


async def fetch(events):
    """An async def stage function (not allowed)."""
    return events
